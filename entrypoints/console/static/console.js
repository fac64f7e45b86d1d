// bb console: keeps the page's parts current from the server's events, and filters the fleet.
// Every fragment is HTML the server escaped; a transcript line is set as text, never as HTML.
"use strict";
(function () {
  const live = document.body.dataset.live;
  const state = document.getElementById("live-state");
  const transcript = document.getElementById("transcript");

  function show(text, kind) {
    state.textContent = text;
    state.className = kind;
  }

  function fill(parts) {
    for (const [id, html] of Object.entries(parts)) {
      const element = document.getElementById(id);
      if (element) element.innerHTML = html;
    }
    filterRows();
  }

  function addLine(line) {
    const follow = transcript.scrollTop + transcript.clientHeight >= transcript.scrollHeight - 4;
    const row = document.createElement("span");
    row.className = line.step ? "line step" : "line";
    row.textContent = (line.step ? "» " : "  ") + line.text + "\n";
    if (line.at) row.title = line.at;
    transcript.appendChild(row);
    if (follow) transcript.scrollTop = transcript.scrollHeight;
  }

  // The filters' choices are what the rows hold; a choice made stays while rows come and go.
  const filters = Array.from(document.querySelectorAll("select[data-filter]"));
  function filterRows() {
    const rows = Array.from(document.querySelectorAll("#environments tr[data-status]"));
    for (const select of filters) {
      const key = select.dataset.filter;
      const chosen = select.value;
      const values = Array.from(new Set(rows.map((row) => row.dataset[key]).filter(Boolean))).sort();
      if (chosen && !values.includes(chosen)) values.push(chosen);
      const have = Array.from(select.options).slice(1).map((option) => option.value);
      if (have.join("\n") !== values.join("\n")) {
        select.length = 1;
        for (const value of values) select.add(new Option(value, value));
        select.value = chosen;
      }
    }
    for (const row of rows) {
      row.hidden = !filters.every((select) => !select.value || row.dataset[select.dataset.filter] === select.value);
    }
  }
  for (const select of filters) select.addEventListener("change", filterRows);
  filterRows();

  // Ages and last-seen times run on between two reads of the service (as the server says them).
  function spoken(ms) {
    if (ms < 1000) return ms + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
    const minutes = Math.floor(ms / 60000);
    if (minutes < 60) return minutes + " min " + (Math.floor(ms / 1000) % 60) + " s";
    return Math.floor(minutes / 60) + " h " + (minutes % 60) + " min";
  }
  setInterval(() => {
    for (const time of document.querySelectorAll("time[data-suffix]")) {
      time.textContent = spoken(Math.max(0, Date.now() - Date.parse(time.dateTime))) + time.dataset.suffix;
    }
  }, 1000);

  // The browser connects again by itself after a dropped stream, but not after an answer that is
  // not a stream (the service was unreachable): then this does, a few seconds later.
  function connect() {
    const source = new EventSource(live);
    source.onopen = () => show("live", "live");
    source.onerror = () => {
      show("reconnecting", "connecting");
      if (source.readyState === EventSource.CLOSED) setTimeout(connect, 3000);
    };
    source.addEventListener("parts", (event) => fill(JSON.parse(event.data)));
    source.addEventListener("reset", () => {
      if (transcript) transcript.textContent = "";
    });
    source.addEventListener("line", (event) => {
      if (transcript) addLine(JSON.parse(event.data));
    });
  }
  if (live) connect();
})();
