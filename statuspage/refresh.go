package statuspage

import (
	"crypto/sha256"
	"encoding/base64"
	"html/template"
)

// refreshScript refreshes an open overview in place: every data-refresh
// seconds (of #refresh) it fetches the page again and swaps the content of
// #live, so nothing flickers and scroll position stays; the checkbox
// pauses it, and a hidden tab does not poll. Without script the page is
// an ordinary page and the checkbox stays hidden. It is the page's only
// script, allowed by its hash in the Content-Security-Policy.
const refreshScript = `(function () {
  var box = document.getElementById('autorefresh');
  var note = document.getElementById('refreshed');
  var live = document.getElementById('live');
  var ctl = document.getElementById('refresh');
  if (!box || !note || !live || !ctl) return;
  var every = Number(ctl.getAttribute('data-refresh')) * 1000;
  if (!(every > 0)) return;
  ctl.hidden = false;
  function tick() {
    if (!box.checked || document.hidden) return;
    fetch(location.href, {cache: 'no-store', credentials: 'same-origin'})
      .then(function (r) { if (!r.ok) throw new Error('HTTP ' + r.status); return r.text(); })
      .then(function (text) {
        var next = new DOMParser().parseFromString(text, 'text/html').getElementById('live');
        if (!next) throw new Error('no content');
        live.innerHTML = next.innerHTML;
        note.textContent = 'updated ' + new Date().toLocaleTimeString();
        note.className = 'muted';
      })
      .catch(function (e) {
        note.textContent = 'refresh failed (' + e.message + '); retrying';
        note.className = 'bad';
      });
  }
  setInterval(tick, every);
})();`

// refreshScriptHash is refreshScript's CSP source expression.
var refreshScriptHash = func() string {
	sum := sha256.Sum256([]byte(refreshScript))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}()

// refreshJS is refreshScript for the template, which inserts it verbatim.
func refreshJS() template.JS { return template.JS(refreshScript) }
