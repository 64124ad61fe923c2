// The console's own script (no build step). It sends the page's CSRF token with every htmx
// request, keeps a check-all box in step with the boxes of its table, keeps a live log at its
// newest line while its reader is at its end (as `tail -f` does; scrolling up stops following,
// scrolling back down resumes it), and makes the times that run ("running for 3.2 s") tick.
(function () {
  "use strict";
  document.addEventListener("htmx:configRequest", function (event) {
    var meta = document.querySelector('meta[name="csrf-token"]');
    if (meta) {
      event.detail.headers["X-CSRF-Token"] = meta.content;
    }
  });
  function atEnd(pane) {
    return pane.scrollTop + pane.clientHeight >= pane.scrollHeight - 4;
  }
  function isLog(event) {
    var target = event.detail && event.detail.target;
    return target && target.id === "log" ? target : null;
  }
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var log = isLog(event);
    if (log) {
      log.dataset.follow = atEnd(log) ? "yes" : "no";
    }
  });
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    var log = isLog(event);
    if (log && log.dataset.follow !== "no") {
      log.scrollTop = log.scrollHeight;
    }
  });
  // A live log opens at its newest line.
  document.addEventListener("DOMContentLoaded", function () {
    var log = document.getElementById("log");
    var live = document.querySelector("#log-more[hx-get]");
    if (log && live) {
      log.scrollTop = log.scrollHeight;
    }
  });
  // What the server writes as pages::duration does: 850 ms, 12.5 s, 3m 07s, 58h 32m.
  function duration(ms) {
    function two(n) {
      return (n < 10 ? "0" : "") + n;
    }
    if (ms < 1000) {
      return ms + " ms";
    }
    if (ms < 60000) {
      return (ms / 1000).toFixed(1) + " s";
    }
    if (ms < 3600000) {
      return Math.floor(ms / 60000) + "m " + two(Math.floor(ms / 1000) % 60) + "s";
    }
    return Math.floor(ms / 3600000) + "h " + two(Math.floor(ms / 60000) % 60) + "m";
  }
  setInterval(function () {
    document.querySelectorAll("[data-since]").forEach(function (el) {
      var since = Date.parse(el.dataset.since);
      if (!isNaN(since)) {
        el.textContent = duration(Math.max(0, Date.now() - since));
      }
    });
  }, 1000);
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
