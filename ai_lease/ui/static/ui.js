// ai-lease ui: live updates. The page names its stream (data-stream) and the element the
// stream's HTML replaces (data-target); the server renders and escapes that HTML. Between
// updates the relative times (cells with data-s: seconds when rendered) tick here.
(function () {
  "use strict";
  var body = document.body;
  var renderedAt = Date.now();

  function span(seconds) {
    if (seconds < 1) { return Math.round(seconds * 1000) + " ms"; }
    if (seconds < 10) { return seconds.toFixed(1) + " s"; }
    if (seconds < 60) { return Math.round(seconds) + " s"; }
    if (seconds >= 86400) { return Math.round(seconds / 86400) + " d"; }
    if (seconds >= 3600) { return Math.round(seconds / 3600) + " h"; }
    return Math.round(seconds / 60) + " min";
  }

  function tick() {
    var grown = (Date.now() - renderedAt) / 1000;
    var cells = document.querySelectorAll("[data-s]");
    for (var i = 0; i < cells.length; i++) {
      var seconds = parseFloat(cells[i].getAttribute("data-s")) + grown;
      var text = span(seconds);
      cells[i].textContent = cells[i].hasAttribute("data-ago") ? text + " ago" : text;
    }
  }
  window.setInterval(tick, 1000);

  var url = body.getAttribute("data-stream");
  var target = body.getAttribute("data-target");
  if (!url || !target || !window.EventSource) {
    return;
  }
  var events = null;
  function replace(event) {
    var element = document.getElementById(target);
    if (!element) {
      return;
    }
    var snapshot = document.getElementById("snapshot");
    var open = snapshot ? snapshot.open : false;
    if (event.data.lastIndexOf("<template data-part=", 0) === 0) {
      replaceParts(event.data);
    } else {
      element.innerHTML = event.data;
    }
    renderedAt = Date.now();
    snapshot = document.getElementById("snapshot");
    if (snapshot && open) {
      snapshot.open = true;
    }
    body.setAttribute("data-updated", String(renderedAt));
    offerActions();
  }

  // An update in parts (the jobs page: its summary and its rows): each <template
  // data-part="ID"> fills the element of that id, which stays in place.
  function replaceParts(html) {
    var holder = document.createElement("div");
    holder.innerHTML = html;
    var parts = holder.querySelectorAll("template[data-part]");
    for (var i = 0; i < parts.length; i++) {
      var element = document.getElementById(parts[i].getAttribute("data-part"));
      if (element) {
        element.innerHTML = parts[i].innerHTML;
      }
    }
  }

  // A job page offers only the actions its job's status allows (each form's data-when).
  function offerActions() {
    var status = document.getElementById("job-status");
    if (!status) {
      return;
    }
    var now = status.getAttribute("data-status");
    var forms = document.querySelectorAll("form[data-when]");
    for (var i = 0; i < forms.length; i++) {
      forms[i].hidden = forms[i].getAttribute("data-when").split(" ").indexOf(now) < 0;
    }
  }
  function listen() {
    events = new EventSource(url);
    events.addEventListener("rows", replace);
    events.addEventListener("job", replace);
    events.addEventListener("workers", replace);
  }

  // A page left for another may be kept (the back/forward cache) with its stream open:
  // Chromium then holds one of its six connections to the dashboard per page left, and the
  // seventh page never loads. So the stream closes when the page is hidden and opens again
  // if it is shown from that cache.
  window.addEventListener("pagehide", function () {
    if (events) {
      events.close();
      events = null;
    }
  });
  window.addEventListener("pageshow", function (event) {
    if (event.persisted && !events) {
      listen();
    }
  });
  listen();
})();
