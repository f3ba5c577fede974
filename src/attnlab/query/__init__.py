"""Query-related attention (survey section 3.3): mechanisms defined by their queries --
self-attention, multi-head, multi-hop, capsule-based, attention-over-attention, pointer
networks and the Transformer variants -- composed from :mod:`attnlab.general`."""
