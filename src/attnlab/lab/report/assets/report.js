
(function () {
  var ready = [];
  window.attnlabReport = {
    onReady: function (fn) { ready.push(fn); }
  };

  function cellValue(cell) {
    var v = cell.getAttribute("data-value");
    if (v !== null && v !== "") { return parseFloat(v); }
    return cell.textContent.trim().toLowerCase();
  }

  function makeSortable(table) {
    var heads = table.querySelectorAll("thead th");
    Array.prototype.forEach.call(heads, function (th, index) {
      th.title = "click to sort";
      th.addEventListener("click", function () {
        var body = table.tBodies[0];
        if (!body) { return; }
        var rows = Array.prototype.slice.call(body.rows);
        var ascending = th.getAttribute("data-sorted") !== "asc";
        rows.sort(function (a, b) {
          var x = cellValue(a.cells[index]);
          var y = cellValue(b.cells[index]);
          if (typeof x === "number" && typeof y === "number") {
            if (isNaN(x)) { return 1; }
            if (isNaN(y)) { return -1; }
            return ascending ? x - y : y - x;
          }
          x = String(x); y = String(y);
          return ascending ? x.localeCompare(y) : y.localeCompare(x);
        });
        rows.forEach(function (row) { body.appendChild(row); });
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("data-sorted"); });
        th.setAttribute("data-sorted", ascending ? "asc" : "desc");
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), makeSortable);
    ready.forEach(function (fn) { fn(document); });
    document.body.setAttribute("data-report-ready", "1");
  });
})();
