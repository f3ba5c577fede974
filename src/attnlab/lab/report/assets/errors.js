
(function () {
  var errors = [];
  function show() {
    var box = document.getElementById("report-errors");
    if (box) {
      box.setAttribute("data-count", String(errors.length));
      box.textContent = errors.join("\n");
    }
  }
  window.__reportErrors = errors;
  window.addEventListener("error", function (event) {
    errors.push("error: " + (event.message || String(event.error)));
    show();
  });
  window.addEventListener("unhandledrejection", function (event) {
    errors.push("unhandled rejection: " + String(event.reason));
    show();
  });
  var original = console.error;
  console.error = function () {
    errors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    show();
    if (original) { original.apply(console, arguments); }
  };
  document.addEventListener("DOMContentLoaded", show);
})();
