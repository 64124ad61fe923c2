// The console's own script (no build step). It sends the page's CSRF token with every htmx
// request, and keeps a check-all box in step with the boxes of its table.
(function () {
  "use strict";
  document.addEventListener("htmx:configRequest", function (event) {
    var meta = document.querySelector('meta[name="csrf-token"]');
    if (meta) {
      event.detail.headers["X-CSRF-Token"] = meta.content;
    }
  });
  document.addEventListener("change", function (event) {
    var all = event.target;
    if (!all.matches || !all.matches("input[data-check-all]")) {
      return;
    }
    var boxes = document.querySelectorAll('input[name="' + all.dataset.checkAll + '"]');
    boxes.forEach(function (box) {
      box.checked = all.checked;
    });
  });
})();
