// Behaviour of the Acme Desk test application. State a task checker reads lives in
// sessionStorage (window.hivigState()), so it survives navigation between pages of one episode.
(function () {
  "use strict";
  var KEY = "hivig-state";

  function state() {
    try {
      return JSON.parse(sessionStorage.getItem(KEY) || "{}");
    } catch (e) {
      return {};
    }
  }

  function save(patch) {
    var s = Object.assign(state(), patch);
    sessionStorage.setItem(KEY, JSON.stringify(s));
    return s;
  }

  window.hivigState = state;
  // A new episode that reloads the same page starts at the top, not where the last one was.
  history.scrollRestoration = "manual";

  function byId(id) {
    return document.getElementById(id);
  }

  // Clicks on links start a navigation; the driver waits for it to finish before capturing.
  document.addEventListener("click", function (e) {
    var target = e.target.closest ? e.target.closest("[id]") : null;
    window.__hivigLastClick = target ? target.id : null;
    var link = e.target.closest ? e.target.closest("a[href]") : null;
    if (link && !e.defaultPrevented) {
      window.__hivigNavigating = true;
    }
  });

  // Header clock: the volatile region of every screen, like a desktop clock. Updated on the
  // second boundary; the driver can switch it off for byte-identical screenshots.
  function tick() {
    var clock = byId("clock");
    if (!clock || window.__hivigNoClock) {
      return;
    }
    clock.textContent = new Date().toTimeString().slice(0, 8);
    setTimeout(tick, 1000 - (Date.now() % 1000) + 5);
  }
  tick();

  if (state().dark) {
    document.body.classList.add("dark");
  }

  // --- Home: refresh, settings dialog, a disabled publish button --------------------------
  if (byId("refresh-btn")) {
    byId("refresh-btn").addEventListener("click", function () {
      byId("status").textContent = "Up to date";
      save({ refreshed: true });
    });
    var dialog = byId("settings-dialog");
    byId("settings-btn").addEventListener("click", function () {
      var s = state();
      byId("dark-toggle").checked = !!s.dark;
      byId("email-toggle").checked = s.email !== false;
      dialog.showModal();
    });
    byId("settings-close").addEventListener("click", function () {
      dialog.close();
    });
    byId("settings-save").addEventListener("click", function () {
      var s = save({ dark: byId("dark-toggle").checked, email: byId("email-toggle").checked });
      document.body.classList.toggle("dark", s.dark);
      byId("status").textContent = "Settings saved";
      dialog.close();
    });
    // Never fires while the button is disabled; here so the button is an honest control.
    byId("publish-btn").addEventListener("click", function () {
      save({ published: true });
    });
  }

  // --- Items: click selects one row --------------------------------------------------------
  if (byId("item-list")) {
    var rows = document.querySelectorAll("#item-list li");
    var selected = state().selected;
    rows.forEach(function (row) {
      if (row.id === selected) {
        row.classList.add("selected");
        byId("selection").textContent = "Selected: " + row.textContent;
      }
      row.addEventListener("click", function () {
        rows.forEach(function (r) {
          r.classList.toggle("selected", r === row);
        });
        byId("selection").textContent = "Selected: " + row.textContent;
        save({ selected: row.id });
      });
    });
  }

  // --- Form: validated submit without navigation -------------------------------------------
  if (byId("contact-form")) {
    byId("contact-form").addEventListener("submit", function (e) {
      e.preventDefault();
      var result = byId("form-result");
      var name = byId("name").value.trim();
      if (!name) {
        result.textContent = "Name is required";
        result.className = "status error";
        return;
      }
      var form = {
        name: name,
        email: byId("email").value.trim(),
        role: byId("role").value,
        subscribe: byId("subscribe").checked,
      };
      save({ form: form });
      result.textContent = "Saved contact " + name;
      result.className = "status";
    });
  }

  // --- Reports: a slow panel with a spinner until the server answers -----------------------
  if (byId("report-panel")) {
    var load = function () {
      byId("report-loading").hidden = false;
      byId("report-content").hidden = true;
      window.__hivigReportLoaded = false;
      fetch("api/report", { cache: "no-store" })
        .then(function (r) {
          return r.json();
        })
        .then(function (data) {
          var body = document.querySelector("#report-table tbody");
          body.textContent = "";
          data.rows.forEach(function (cells) {
            var tr = document.createElement("tr");
            cells.forEach(function (c) {
              var td = document.createElement("td");
              td.textContent = c;
              tr.appendChild(td);
            });
            body.appendChild(tr);
          });
          byId("report-loading").hidden = true;
          byId("report-content").hidden = false;
          window.__hivigReportLoaded = true;
          save({ report_seen: true });
        });
    };
    byId("reload-btn").addEventListener("click", load);
    load();
  }
})();
