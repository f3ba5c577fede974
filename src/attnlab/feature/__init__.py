"""Feature-related attention (survey section 3.1): mechanisms defined by the features they
attend over -- several inputs (co-attention, rotatory attention), several levels
(attention-via-attention, hierarchical attention) and several representations
(meta-embeddings). Each is composed from the general parts in :mod:`attnlab.general`."""
