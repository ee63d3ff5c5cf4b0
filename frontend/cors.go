package frontend

import (
	"net/http"
	"slices"
	"strings"
)

// CORS as the service applies an account's rules (its service
// properties): a preflight (OPTIONS, unauthenticated) succeeds when a
// rule allows its Origin, Access-Control-Request-Method and every
// Access-Control-Request-Headers name; an actual request from an Origin
// a rule allows (origin and method) gets Access-Control-Allow-Origin and
// the rule's exposed headers, on errors too. The first matching rule
// applies.

// originAllowed says whether a rule's AllowedOrigins admit origin ("*"
// admits all; otherwise a case-insensitive exact match).
func (r *corsRule) originAllowed(origin string) bool {
	for _, o := range splitList(r.AllowedOrigins) {
		if o == "*" || strings.EqualFold(o, strings.TrimSpace(origin)) {
			return true
		}
	}
	return false
}

func (r *corsRule) methodAllowed(method string) bool {
	return slices.ContainsFunc(splitList(r.AllowedMethods), func(m string) bool { return strings.EqualFold(m, strings.TrimSpace(method)) })
}

// headerMatch says whether header is in list: a name matches itself
// (case-insensitively) and a name ending in * matches its prefix.
func headerMatch(list []string, header string) bool {
	h := strings.ToLower(strings.TrimSpace(header))
	for _, a := range list {
		a = strings.ToLower(a)
		if a == h || strings.HasSuffix(a, "*") && strings.HasPrefix(h, a[:len(a)-1]) {
			return true
		}
	}
	return false
}

func (r *corsRule) headersAllowed(requested string) bool {
	allowed := splitList(r.AllowedHeaders)
	for _, h := range splitList(requested) {
		if h != "" && !headerMatch(allowed, h) {
			return false
		}
	}
	return true
}

// allowsAny says whether a rule admits every origin.
func (r *corsRule) allowsAny() bool { return slices.Contains(splitList(r.AllowedOrigins), "*") }

var (
	errCorsHeader    = &svcError{status: http.StatusBadRequest, code: "InvalidHeaderValue", msg: "A required CORS header is not present."}
	errCorsPreflight = &svcError{status: http.StatusForbidden, code: "CorsPreflightFailure", msg: "CORS not enabled or no matching rule found for this request."}
)

// preflight answers an OPTIONS request for account.
func (q *request) preflight(account string) {
	q.xmlErrors = true
	origin := q.r.Header.Get("Origin")
	method := q.r.Header.Get("Access-Control-Request-Method")
	if origin == "" || method == "" {
		q.fail(errCorsHeader)
		return
	}
	if !q.g.knownAccount(q.r.Context(), account) {
		q.fail(errCorsPreflight)
		return
	}
	acct, err := q.g.account(account)
	if err != nil {
		q.fail(err)
		return
	}
	props, err := acct.settings.serviceProps(q.r.Context())
	if err != nil {
		// An unknown account has no rules.
		q.g.log.Debug("preflight: no service properties", "account", account, "err", err)
		q.fail(errCorsPreflight)
		return
	}
	reqHeaders, haveHeaders := q.r.Header["Access-Control-Request-Headers"]
	joined := strings.Join(reqHeaders, ",")
	for i := range props.Cors.Rules {
		r := &props.Cors.Rules[i]
		if !r.originAllowed(origin) || !r.methodAllowed(method) || !r.headersAllowed(joined) {
			continue
		}
		h := q.w.Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Set("Access-Control-Allow-Methods", method)
		if haveHeaders {
			h.Set("Access-Control-Allow-Headers", joined)
		}
		h.Set("Access-Control-Max-Age", strings.TrimSpace(r.MaxAgeInSeconds))
		h.Set("Access-Control-Allow-Credentials", "true")
		h.Set("Content-Length", "0")
		q.w.WriteHeader(http.StatusOK)
		return
	}
	q.fail(errCorsPreflight)
}

// corsWriter adds an actual request's CORS headers when its response
// starts: the exposed headers are the response's own that the rule
// names.
type corsWriter struct {
	http.ResponseWriter
	rule   *corsRule // the matching rule; nil: none matched
	origin string
	vary   bool // rules exist, none matched: the answer varies by Origin
	wrote  bool
}

func (w *corsWriter) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		w.apply()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *corsWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *corsWriter) apply() {
	h := w.Header()
	if w.rule == nil {
		if w.vary {
			h.Add("Vary", "Origin")
		}
		return
	}
	h.Set("Access-Control-Expose-Headers", exposedHeaders(h, splitList(w.rule.ExposedHeaders)))
	if w.rule.allowsAny() {
		h.Set("Access-Control-Allow-Origin", "*")
		return
	}
	h.Set("Access-Control-Allow-Origin", w.origin)
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Allow-Credentials", "true")
}

// exposedHeaders lists the response headers the rule's ExposedHeaders
// name (literals and prefixes), then the rule's literal names the
// response lacks, as the service does.
func exposedHeaders(h http.Header, rule []string) string {
	names := make([]string, 0, len(h)+3)
	for k := range h {
		names = append(names, strings.ToLower(k))
	}
	names = append(names, "date", "connection", "transfer-encoding")
	slices.Sort(names)
	names = slices.Compact(names)
	var out []string
	for _, n := range names {
		if headerMatch(rule, n) {
			out = append(out, n)
		}
	}
	for _, r := range rule {
		if !strings.HasSuffix(r, "*") && !slices.Contains(out, strings.ToLower(r)) {
			out = append(out, r)
		}
	}
	return strings.Join(out, ",")
}

// corsFor wraps w for a request from origin to account when the account
// has CORS rules; w itself otherwise.
func (q *request) corsFor(account, origin string) http.ResponseWriter {
	acct, err := q.g.account(account)
	if err != nil {
		return q.w
	}
	props, err := acct.settings.serviceProps(q.r.Context())
	if err != nil || len(props.Cors.Rules) == 0 {
		return q.w
	}
	cw := &corsWriter{ResponseWriter: q.w, origin: origin, vary: true}
	for i := range props.Cors.Rules {
		r := &props.Cors.Rules[i]
		if r.originAllowed(origin) && r.methodAllowed(q.r.Method) {
			cw.rule = r
			break
		}
	}
	return cw
}
