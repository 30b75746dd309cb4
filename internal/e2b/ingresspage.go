package e2b

import (
	"html/template"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// E2B's edge answers a browser's request for a port it cannot reach with
// an HTML page, and every other client with JSON (ingressError), both
// with the same status. A request is a browser's when its Accept prefers
// text/html to application/json; when Accept does not choose (absent,
// */*, as fetch sends), when its User-Agent is a browser's, which is how
// E2B's edge tells them apart. An Accept that refuses text/html (q=0)
// gets JSON.

// ingressPage is the HTML of an ingress error.
var ingressPage = template.Must(template.New("ingress").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>{{.Title}}</title>
<style>body{font-family:system-ui,sans-serif;background:#f5f5f5;color:#1a1a1a;display:flex;min-height:100vh;align-items:center;justify-content:center;margin:0}main{background:#fff;border-radius:12px;max-width:600px;padding:1.5rem 2rem;box-shadow:0 2px 6px rgb(0 0 0/.1)}h1{color:#dc2626;font-size:1rem}code{font-size:.875rem;color:#374151}</style>
</head>
<body>
<main>
<h1>{{.Title}}</h1>
<p>{{.Message}}</p>
<p><code>sandbox {{.SandboxID}}{{if .Port}}, port {{.Port}}{{end}}</code></p>
</main>
</body>
</html>
`))

// IngressNotRunning answers a request for port of sandbox id, which is
// not running (or not known): E2B's 502. A cluster's gateway answers the
// same for an id no node holds.
func IngressNotRunning(w http.ResponseWriter, r *http.Request, id string, port int) {
	ingressFail(w, r, http.StatusBadGateway, "Sandbox Not Running", ingressError{SandboxID: id, Message: "The sandbox is not running", Port: strconv.Itoa(port)})
}

var browserAgent = regexp.MustCompile(`(?i)mozilla|chrome|safari|firefox|edge|opera|msie`)

// ingressFail answers r with an ingress error: title names it on the
// HTML page.
func ingressFail(w http.ResponseWriter, r *http.Request, code int, title string, e ingressError) {
	if !wantsHTML(r) {
		writeJSON(w, code, e)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	ingressPage.Execute(w, struct {
		Title string
		ingressError
	}{Title: title, ingressError: e})
}

// wantsHTML reports whether r is a browser's.
func wantsHTML(r *http.Request) bool {
	html, json := acceptQ(r.Header.Values("Accept"), "text/html"), acceptQ(r.Header.Values("Accept"), "application/json")
	if html != json || html == 0 {
		return html > json
	}
	return browserAgent.MatchString(r.UserAgent())
}

// acceptQ is the quality Accept gives the media type typ (type/subtype):
// that of its most specific matching range; 1 when Accept is absent.
func acceptQ(accept []string, typ string) float64 {
	if len(accept) == 0 {
		return 1
	}
	major, _, _ := strings.Cut(typ, "/")
	q, specificity := 0.0, -1
	for _, line := range accept {
		for _, part := range strings.Split(line, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil {
				continue
			}
			s := -1
			switch mt {
			case typ:
				s = 2
			case major + "/*":
				s = 1
			case "*/*":
				s = 0
			}
			if s <= specificity {
				continue
			}
			v := 1.0
			if qs, ok := params["q"]; ok {
				if v, err = strconv.ParseFloat(qs, 64); err != nil || v < 0 || v > 1 {
					continue
				}
			}
			q, specificity = v, s
		}
	}
	return q
}
