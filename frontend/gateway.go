package frontend

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend/bearer"
	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// DefaultVersion is the x-ms-version the gateway answers with when a
// request names none: the one aztables for Go sends.
const DefaultVersion = "2019-02-02"

// Options configure a Gateway. Masters and Credential are required.
type Options struct {
	// Masters are the Table Master addresses.
	Masters []string
	// Credential is the cluster credential: the gateway acts for every
	// account (tenant) and reads the tenants' keys to check signatures.
	Credential client.Credential
	// TLS dials the masters and servers over TLS when set.
	TLS *tls.Config
	// Logger receives the gateway's logs. Default: discard.
	Logger *slog.Logger
	// Now is the clock requests are checked and stamped with. Default
	// time.Now.
	Now func() time.Time
	// Bearer checks OAuth bearer tokens (Authorization: Bearer, over
	// HTTPS). Default nil: bearer tokens are refused.
	Bearer *bearer.Verifier
	// KeyRefresh bounds how often an unknown account or a refused
	// signature makes the gateway fetch the tenants' keys again.
	// Default 1s.
	KeyRefresh time.Duration
}

// Gateway serves the Azure Table REST API over a Tabula cluster:
// path-style addressing (/account/Table...), accounts are tenants and
// their keys the tenants' keys, tables are the tenant's ordered tables,
// an entity is one record keyed by (PartitionKey, RowKey). It keeps no
// state of its own beyond caches: run as many as wanted.
//
// A Gateway is safe for concurrent use.
type Gateway struct {
	opts Options
	log  *slog.Logger
	keys *tenantKeys

	mu sync.Mutex
	// Guarded by mu.
	accounts map[string]*account
	closed   bool

	stampMu sync.Mutex
	lastTS  time.Time // guarded by stampMu: the last Timestamp given
}

// New returns a gateway for the cluster at opts.Masters.
func New(ctx context.Context, opts Options) (*Gateway, error) {
	if len(opts.Masters) == 0 {
		return nil, errors.New("frontend: no master addresses")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.KeyRefresh <= 0 {
		opts.KeyRefresh = time.Second
	}
	keys, err := newTenantKeys(opts)
	if err != nil {
		return nil, err
	}
	g := &Gateway{opts: opts, log: opts.Logger, keys: keys, accounts: map[string]*account{}}
	if err := keys.refresh(ctx, true); err != nil {
		g.log.Warn("could not read the tenants' keys yet; retrying on the first request", "err", err)
	}
	return g, nil
}

// Close ends the gateway's connections. Requests in flight fail.
func (g *Gateway) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	accts := g.accounts
	g.accounts = nil
	g.mu.Unlock()
	var errs []error
	for _, a := range accts {
		errs = append(errs, a.c.Close())
	}
	errs = append(errs, g.keys.close())
	return errors.Join(errs...)
}

// stamp returns the Timestamp of a write: now, in 100 ns ticks, after
// every stamp given before (and after prev, the entity's last one), so
// an entity's ETag changes with every write.
func (g *Gateway) stamp(prev time.Time) time.Time {
	g.stampMu.Lock()
	defer g.stampMu.Unlock()
	t := g.opts.Now().UTC().Truncate(100 * time.Nanosecond)
	if !t.After(g.lastTS) {
		t = g.lastTS.Add(100 * time.Nanosecond)
	}
	if !t.After(prev) {
		t = prev.Add(100 * time.Nanosecond)
	}
	g.lastTS = t
	return t
}

// request is one request being served.
type request struct {
	g       *Gateway
	w       http.ResponseWriter
	r       *http.Request
	id      string // x-ms-request-id
	account string // the path's account, without "-secondary"
	acct    *account
	p       sharedkey.Principal
	version string
	base    string // the account's URL: scheme://host/account
	rest    string // the path after the account, without the leading slash
	// xmlErrors: errors are answered in XML (service and ACL operations,
	// CORS preflights), as the service does; OData JSON otherwise.
	xmlErrors bool
}

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var idb [16]byte
	_, _ = rand.Read(idb[:])
	q := &request{g: g, w: w, r: r, id: formatUUID(idb)}
	h := w.Header()
	h.Set("x-ms-request-id", q.id)
	h.Set("Date", g.opts.Now().UTC().Format(http.TimeFormat))
	if v := r.Header.Get("x-ms-client-request-id"); v != "" {
		h.Set("x-ms-client-request-id", v)
	}
	q.version = r.Header.Get("x-ms-version")
	if q.version != "" && !versions[q.version] {
		h.Set("x-ms-version", DefaultVersion)
		q.fail(errVersion(q.version))
		return
	}
	if q.version == "" {
		q.version = DefaultVersion
	}
	h.Set("x-ms-version", q.version)
	path := strings.TrimPrefix(r.URL.EscapedPath(), "/")
	acct, rest, _ := strings.Cut(path, "/")
	if acct == "" {
		q.fail(&svcError{status: http.StatusBadRequest, code: "InvalidUri", msg: "The requested URI does not represent any resource on the server (path-style addressing: /account/Table)."})
		return
	}
	var err error
	if q.rest, err = url.PathUnescape(rest); err != nil {
		q.fail(&svcError{status: http.StatusBadRequest, code: "InvalidUri", msg: "The request URI is not valid: " + err.Error()})
		return
	}
	if r.Method == http.MethodOptions {
		q.preflight(strings.TrimSuffix(acct, "-secondary"))
		return
	}
	if origin := r.Header.Get("Origin"); origin != "" && g.knownAccount(r.Context(), strings.TrimSuffix(acct, "-secondary")) {
		q.w = q.corsFor(strings.TrimSuffix(acct, "-secondary"), origin)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	q.base = scheme + "://" + r.Host + "/" + acct
	var p sharedkey.Principal
	if auth := r.Header.Get("Authorization"); len(auth) > 7 && strings.EqualFold(auth[:7], "Bearer ") {
		p, err = g.verifyBearer(r, acct, strings.TrimSpace(auth[7:]), q.base)
	} else {
		p, err = g.keys.verify(r, acct, requestKeys{ctx: r.Context(), g: g}, g.opts.Now())
	}
	if err != nil {
		q.fail(err)
		return
	}
	q.p, q.account = p, p.Account
	if p.Version != "" {
		q.version = p.Version
	}
	if p.Secondary && r.Method != http.MethodGet && r.Method != http.MethodHead {
		q.fail(&svcError{status: http.StatusForbidden, code: "AuthorizationFailure", msg: "Write operations are not allowed on the secondary location."})
		return
	}
	if q.acct, err = g.account(q.account); err != nil {
		q.fail(err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout(r))
	defer cancel()
	q.serve(ctx)
}

// verifyBearer authenticates a bearer token for path account acct
// ("x-secondary" for x's secondary) addressed at base.
func (g *Gateway) verifyBearer(r *http.Request, acct, token, base string) (sharedkey.Principal, error) {
	failed := func(detail string) error {
		return &sharedkey.Error{Code: sharedkey.CodeAuthenticationFailed, Status: http.StatusForbidden,
			Message: "Server failed to authenticate the request. Make sure the value of the Authorization header is formed correctly including the signature.",
			Detail:  detail}
	}
	name, secondary := strings.CutSuffix(acct, "-secondary")
	if g.opts.Bearer == nil {
		return sharedkey.Principal{}, failed(bearer.DetailUnsupported)
	}
	if r.TLS == nil {
		return sharedkey.Principal{}, failed("Authentication scheme Bearer is not allowed with HTTP.")
	}
	if !g.knownAccount(r.Context(), name) {
		return sharedkey.Principal{}, errResourceNotFound
	}
	role, err := g.opts.Bearer.Verify(token, name, strings.TrimSuffix(base, "-secondary"), g.opts.Now())
	var be *bearer.Error
	if errors.As(err, &be) {
		return sharedkey.Principal{}, failed(be.Detail)
	} else if err != nil {
		return sharedkey.Principal{}, err
	}
	p := sharedkey.Principal{Account: name, Secondary: secondary, Kind: sharedkey.KindBearer, ResourceTypes: sharedkey.ResAll,
		Perms: sharedkey.PermRead | sharedkey.PermList}
	if role == bearer.RoleContributor {
		p.Perms = sharedkey.PermAll
	}
	return p, nil
}

// requestTimeout is the request's timeout parameter (seconds), capped at
// 30 s, the service's limit and default.
func requestTimeout(r *http.Request) time.Duration {
	d := 30 * time.Second
	if s := r.URL.Query().Get("timeout"); s != "" {
		var n int
		if _, err := fmt.Sscanf(s, "%d", &n); err == nil && n > 0 && time.Duration(n)*time.Second < d {
			d = time.Duration(n) * time.Second
		}
	}
	return d
}

// serve routes the request by its resource path.
func (q *request) serve(ctx context.Context) {
	query := q.r.URL.Query()
	switch {
	case query.Get("restype") == "service" || query.Get("comp") != "":
		q.xmlErrors = true
		switch comp, m := query.Get("comp"), q.r.Method; {
		case query.Get("restype") == "service" && comp == "properties" && m == http.MethodGet:
			q.serviceProperties(ctx)
		case query.Get("restype") == "service" && comp == "properties" && m == http.MethodPut:
			q.setServiceProperties(ctx)
		case query.Get("restype") == "service" && comp == "stats" && m == http.MethodGet:
			q.serviceStats()
		case comp == "acl" && m == http.MethodGet && q.rest != "":
			q.tableACL(ctx, strings.TrimSuffix(q.rest, "()"))
		case comp == "acl" && m == http.MethodPut && q.rest != "":
			q.setTableACL(ctx, strings.TrimSuffix(q.rest, "()"))
		default:
			q.fail(&svcError{status: http.StatusBadRequest, code: "InvalidQueryParameterValue",
				msg: "Value for one of the query parameters specified in the request URI is invalid (restype, comp)."})
		}
	case q.rest == "$batch":
		q.batch(ctx)
	case q.rest == "Tables" || q.rest == "Tables()":
		switch q.r.Method {
		case http.MethodGet:
			q.queryTables(ctx)
		case http.MethodPost:
			q.createTable(ctx)
		default:
			q.methodNotAllowed()
		}
	case strings.HasPrefix(q.rest, "Tables('") && strings.HasSuffix(q.rest, "')"):
		name, err := unquote(q.rest[len("Tables(") : len(q.rest)-1])
		if err != nil {
			q.fail(err)
			return
		}
		switch q.r.Method {
		case http.MethodDelete:
			q.deleteTable(ctx, name)
		case http.MethodGet:
			q.getTable(ctx, name)
		default:
			q.methodNotAllowed()
		}
	default:
		table, keys, err := parseEntityPath(q.rest)
		if err != nil {
			q.fail(err)
			return
		}
		q.entityOp(ctx, table, keys)
	}
}

func (q *request) methodNotAllowed() {
	q.fail(&svcError{status: http.StatusMethodNotAllowed, code: "MethodNotAllowed", msg: "The requested method is not allowed on the specified resource."})
}

// entityKeys are the keys an entity path names.
type entityKeys struct {
	set    bool // the path names one entity
	pk, rk string
}

// parseEntityPath reads "table", "table()" or
// "table(PartitionKey='p',RowKey='r')".
func parseEntityPath(rest string) (string, entityKeys, error) {
	name, args, ok := strings.Cut(rest, "(")
	if !ok {
		return name, entityKeys{}, nil
	}
	if !strings.HasSuffix(args, ")") {
		return "", entityKeys{}, invalidURI(rest)
	}
	args = args[:len(args)-1]
	if args == "" {
		return name, entityKeys{}, nil
	}
	var k entityKeys
	havePK, haveRK := false, false
	for args != "" {
		field, after, ok := strings.Cut(args, "=")
		if !ok || !strings.HasPrefix(after, "'") {
			return "", entityKeys{}, invalidURI(rest)
		}
		// The literal runs to the next lone quote ('' is a quote).
		i := 1
		for {
			j := strings.IndexByte(after[i:], '\'')
			if j < 0 {
				return "", entityKeys{}, invalidURI(rest)
			}
			i += j
			if i+1 < len(after) && after[i+1] == '\'' {
				i += 2
				continue
			}
			break
		}
		val := strings.ReplaceAll(after[1:i], "''", "'")
		args = strings.TrimPrefix(after[i+1:], ",")
		switch strings.TrimSpace(field) {
		case "PartitionKey":
			k.pk, havePK = val, true
		case "RowKey":
			k.rk, haveRK = val, true
		default:
			return "", entityKeys{}, invalidURI(rest)
		}
	}
	if !havePK || !haveRK {
		return "", entityKeys{}, invalidURI(rest)
	}
	k.set = true
	return name, k, nil
}

// unquote reads a quoted literal: 'name', a doubled quote for a quote.
func unquote(s string) (string, error) {
	if len(s) < 2 || s[0] != '\'' || s[len(s)-1] != '\'' {
		return "", invalidURI(s)
	}
	return strings.ReplaceAll(s[1:len(s)-1], "''", "'"), nil
}

func invalidURI(s string) error {
	return &svcError{status: http.StatusBadRequest, code: "InvalidUri", msg: fmt.Sprintf("The requested URI does not represent any resource on the server: %q.", s)}
}

// formatUUID renders 16 random bytes as a version-4 UUID.
func formatUUID(b [16]byte) string {
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
