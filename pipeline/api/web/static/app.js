// The status page. A running run's or batch's page follows its progress feed (Server-Sent
// Events, data-feed) and updates in place: the timeline grows, statuses and actions change.
// Other pages reload every data-refresh seconds unless someone is typing or the tab is hidden.
// Everything is built with textContent, never markup; the pages work without JavaScript.
(function () {
  "use strict";
  var body = document.body;
  var TERMINAL = ["succeeded", "failed", "cancelled"];
  var JOURNAL = ["model_replied", "tool_result", "note", "timer_set"];

  if (body.dataset.feed) {
    follow(body.dataset.feed, body.dataset.after || "");
  } else if (Number(body.dataset.refresh || 0)) {
    setInterval(function () {
      var active = document.activeElement;
      var typing = active && (active.tagName === "INPUT" || active.tagName === "TEXTAREA");
      if (!typing && document.visibilityState === "visible") window.location.reload();
    }, Number(body.dataset.refresh) * 1000);
  }

  function follow(url, after) {
    var source = new EventSource(after ? url + "?after=" + encodeURIComponent(after) : url);
    var types = JOURNAL.concat(["run_started", "step_started", "action_changed", "waiting",
                                "resumed", "finished", "batch_changed"]);
    types.forEach(function (type) {
      source.addEventListener(type, function (message) {
        var event = JSON.parse(message.data);
        if (document.getElementById("timeline")) onRunEvent(event);
        else onBatchEvent(event);
        body.dataset.lastEvent = event.id;
      });
    });
    source.addEventListener("end", function () {
      source.close();
      body.dataset.live = "ended";
    });
    source.addEventListener("open", function () { body.dataset.live = "on"; });
  }

  // -- a run's page --------------------------------------------------------------------------

  function onRunEvent(event) {
    if (JOURNAL.indexOf(event.type) >= 0) addEntry(event);
    else if (event.type === "step_started") {
      text("run-step", event.step);
      // A step started again after a failed attempt says which attempt; `attempt` counts
      // every claim of the run (one per step), so it is not shown.
      text("run-step-attempt", event.step_attempt > 1 ? " (attempt " + event.step_attempt + ")" : "");
      showStatus(document.getElementById("run-status"), "running");
    } else if (event.type === "action_changed") showAction(event);
    else if (["waiting", "resumed", "finished"].indexOf(event.type) >= 0) {
      showStatus(document.getElementById("run-status"), event.status, event.waiting_on,
                 event.stop_reason);
      if (event.type === "finished") showEnd(event);
    }
  }

  function addEntry(event) {
    var timeline = document.getElementById("timeline");
    if (byData(timeline, "li", "key", event.key)) return; // already on the page
    var step = byData(timeline, "section", "step", String(event.step));
    if (!step) step = addStep(timeline, event.step);
    var kind = event.key.split(":")[0];
    var entry = element("li", "entry entry-" + kind);
    entry.dataset.key = event.key;
    var details = entry.appendChild(element("details"));
    var summary = details.appendChild(element("summary"));
    summary.appendChild(element("time", "", event.at.slice(11, 19)));
    summary.appendChild(element("span", "kind", kind));
    summary.appendChild(element("code", "key", event.key));
    summary.appendChild(element("span", "summary", event.summary || ""));
    details.appendChild(element("pre", "detail", event.text || event.summary || ""));
    step.querySelector("ol").appendChild(entry);
    document.getElementById("no-timeline").hidden = true;
  }

  function addStep(timeline, number) {
    var section = element("section", "step");
    section.dataset.step = String(number);
    section.appendChild(element("h3", "", "Step " + number));
    section.appendChild(element("ol", "timeline"));
    var later = Array.prototype.filter.call(timeline.children, function (other) {
      return Number(other.dataset.step) > number;
    })[0];
    timeline.insertBefore(section, later || null);
    return section;
  }

  function showAction(event) {
    var table = document.getElementById("actions");
    var row = byData(table, "tr", "key", event.key);
    if (!row) {
      row = table.querySelector("tbody").appendChild(document.createElement("tr"));
      row.dataset.key = event.key;
      var link = element("a", "", event.key);
      link.href = "/ui/actions/" + encodeURIComponent(event.key);
      row.appendChild(element("td")).appendChild(link);
      row.appendChild(element("td", "", event.tool));
      ["state", "attempts", "resolution", "decision", "decide"].forEach(function (name) {
        row.appendChild(element("td", name));
      });
    }
    var state = row.querySelector(".state");
    state.textContent = "";
    state.appendChild(pill(event.state, actionWords(event.state, event.decision)));
    row.querySelector(".attempts").textContent = event.attempts;
    row.querySelector(".resolution").textContent = event.resolution || "";
    row.querySelector(".decision").textContent = event.decision || "";
    var decide = row.querySelector(".decide");
    if (event.state !== "pending_approval") decide.textContent = "";
    else if (!decide.firstChild) {
      var open = element("a", "", "decide");
      open.href = "/ui/actions/" + encodeURIComponent(event.key);
      decide.appendChild(open);
    }
    table.hidden = false;
    document.getElementById("no-actions").hidden = true;
  }

  function showEnd(event) {
    var error = document.getElementById("run-error");
    if (event.error) {
      error.textContent = event.error;
      error.hidden = error.previousElementSibling.hidden = false;
    }
    if (event.result && event.result.text) text("result-text", event.result.text);
    if (event.result) {
      document.getElementById("result-text").hidden = !event.result.text;
      var result = document.getElementById("run-result");
      result.textContent = JSON.stringify(event.result, null, 2);
      result.hidden = document.getElementById("result-heading").hidden = false;
    }
  }

  // -- a batch's page ------------------------------------------------------------------------

  function onBatchEvent(event) {
    if (event.type === "batch_changed") {
      showStatus(document.getElementById("batch-status"), event.status, null, event.stop_reason);
      return;
    }
    if (event.type === "run_started" && !event.batch_id) showSynthesis(event.run_id);
    var status = event.type === "step_started" ? "running" : event.status;
    if (!status || event.type === "action_changed") return;
    var row = byData(document, "tr", "run", event.run_id);
    if (row) {
      showStatus(row.querySelector(".run-status"), status, event.waiting_on);
      row.dataset.status = status;
      if (event.step !== undefined) row.querySelector(".run-step").textContent = event.step;
      row.querySelector(".run-reason").textContent = event.stop_reason || "";
    }
    if (event.type !== "step_started") countChildren();
    var synthesis = byData(document.getElementById("batch-synthesis"), "a", "run", event.run_id);
    if (synthesis) showStatus(synthesis.nextElementSibling, status, event.waiting_on);
  }

  function showSynthesis(runId) {
    var place = document.getElementById("batch-synthesis");
    if (!place || byData(place, "a", "run", runId)) return;
    place.textContent = "";
    var link = element("a", "", runId);
    link.href = "/ui/runs/" + runId;
    link.dataset.run = runId;
    place.appendChild(link);
    place.appendChild(document.createTextNode(" "));
    place.appendChild(element("span", "run-status")).appendChild(pill("running"));
  }

  // The page lists only a page of the children, so their counts come from the server: one
  // request two seconds after a change, however many children change meanwhile, and one more
  // when some changed while it was asked.
  var countsDue = false;
  var counting = false;
  var countAgain = false;

  function countChildren() {
    var place = document.getElementById("batch-children");
    if (!place) return;
    if (counting) countAgain = true;
    if (counting || countsDue) return;
    countsDue = true;
    setTimeout(function () {
      countsDue = false;
      counting = true;
      fetch(place.dataset.progress, {credentials: "same-origin"})
        .then(function (answer) { return answer.ok ? answer.json() : null; })
        .then(function (batch) { if (batch) showCounts(place, batch.children); })
        .catch(function () {})
        .then(function () {
          counting = false;
          if (countAgain) {
            countAgain = false;
            countChildren();
          }
        });
    }, 2000);
  }

  function showCounts(place, children) {
    ["done", "running", "waiting", "failed"].forEach(function (name) {
      place.querySelector(".n-" + name).textContent = children[name];
    });
    place.querySelector(".count").textContent = children.finished + "/" + children.total;
    var bar = place.querySelector("progress");
    bar.max = children.total || 1;
    bar.value = children.finished;
    place.querySelector(".progress").title =
      children.finished + " of " + children.total + " children finished";
  }

  // -- shared --------------------------------------------------------------------------------

  function showStatus(place, status, waitingOn, reason) {
    if (!place) return;
    place.textContent = "";
    place.appendChild(pill(status));
    if (waitingOn && TERMINAL.indexOf(status) < 0 && status !== "running") {
      place.appendChild(document.createTextNode(" " + waitingWords(waitingOn)));
    }
    if (reason) place.appendChild(document.createTextNode(" (" + reason + ")"));
  }

  // The same plain words as pipeline/api/words.py.
  var WORDS = {needs_attention: "needs a person", pending_approval: "waiting for a decision",
               intended: "about to be sent", attempted: "sending",
               outcome_unknown: "unknown whether it happened", confirmed: "done",
               synthesizing: "writing the summary"};

  function pill(status, said) {
    var shown = element("span", "status status-" + status, said || WORDS[status] || status);
    shown.title = status;
    return shown;
  }

  function actionWords(state, decision) {
    if (state === "intended" && decision === "approve") return "approved, sending";
    if (state === "intended" && decision === "did_not_happen") return "did not happen, sending again";
    if (state === "confirmed" && decision === "happened") return "done (a person said it happened)";
    return WORDS[state] || state;
  }

  function waitingWords(waitingOn) {
    var kind = waitingOn.split(":")[0], ref = waitingOn.slice(kind.length + 1);
    if (kind === "approval") return "for a decision on " + ref;
    if (kind === "action") return "for a person to say whether " + ref + " happened";
    if (kind === "timer") return "for its timer";
    if (kind === "retry") return "to try " + ref + " again (the service kept failing)";
    if (kind === "model") return "for the model provider to answer again (" + ref + " is down)";
    return "on " + waitingOn;
  }

  function element(tag, className, content) {
    var made = document.createElement(tag);
    if (className) made.className = className;
    if (content !== undefined && content !== null) made.textContent = String(content);
    return made;
  }

  function text(id, content) {
    var place = document.getElementById(id);
    if (place) place.textContent = String(content);
  }

  // Compared in script, not in a CSS selector: keys hold any characters.
  function byData(root, tag, name, value) {
    if (!root) return null;
    return Array.prototype.filter.call(root.querySelectorAll(tag), function (found) {
      return found.dataset[name] === value;
    })[0] || null;
  }
})();
