
var attnlabWeights = (function () {
  "use strict";
  function num(v) { return (typeof v === "number" && isFinite(v)) ? v : NaN; }
  function fmt(v) { v = num(v); return isNaN(v) ? "n/a" : v.toPrecision(4); }
  function uniform(values) {
    var first = NaN, n = 0;
    for (var i = 0; i < values.length; i++) {
      var v = num(values[i]);
      if (isNaN(v)) { continue; }
      if (n === 0) { first = v; } else if (Math.abs(v - first) > 1e-6 * Math.abs(first)) {
        return false;
      }
      n++;
    }
    return n > 1 && first > 0;
  }
  function scale(values) {
    if (uniform(values)) { return 1; }
    var top = 0;
    for (var i = 0; i < values.length; i++) {
      var v = num(values[i]);
      if (!isNaN(v) && v > top) { top = v; }
    }
    return top > 0 ? top : 1;
  }
  return { num: num, fmt: fmt, uniform: uniform, scale: scale };
})();
