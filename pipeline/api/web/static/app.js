// Keep the status page current: reload every data-refresh seconds, unless someone is typing
// a note or the tab is hidden. Nothing else here; the page works without JavaScript.
(function () {
  "use strict";
  var seconds = Number(document.body.dataset.refresh || 0);
  if (!seconds) return;
  setInterval(function () {
    var active = document.activeElement;
    var typing = active && (active.tagName === "INPUT" || active.tagName === "TEXTAREA");
    if (!typing && document.visibilityState === "visible") window.location.reload();
  }, seconds * 1000);
})();
