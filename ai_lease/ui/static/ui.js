// ai-lease ui: live updates. The page names its stream (data-stream) and the element the
// stream's HTML replaces (data-target); the server renders and escapes that HTML.
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-stream");
  var target = body.getAttribute("data-target");
  if (!url || !target || !window.EventSource) {
    return;
  }
  var events = new EventSource(url);
  function replace(event) {
    var element = document.getElementById(target);
    if (!element) {
      return;
    }
    var snapshot = document.getElementById("snapshot");
    var open = snapshot ? snapshot.open : false;
    element.innerHTML = event.data;
    snapshot = document.getElementById("snapshot");
    if (snapshot && open) {
      snapshot.open = true;
    }
    body.setAttribute("data-updated", String(Date.now()));
  }
  events.addEventListener("rows", replace);
  events.addEventListener("job", replace);
})();
