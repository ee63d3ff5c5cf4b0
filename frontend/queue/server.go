package queue

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend/sharedkey"
	"github.com/tabuladb/tabula/frontend/tenantkeys"
)

// DefaultVersion is the x-ms-version the server answers with when a
// request names none.
const DefaultVersion = "2019-12-12"

// Options configure a Server. Masters and Credential are required.
type Options struct {
	// Masters are the Table Master addresses.
	Masters []string
	// Credential is the cluster credential: the server acts for every
	// account (tenant) and reads the tenants' keys to check signatures.
	Credential client.Credential
	// TLS dials the masters and servers over TLS when set.
	TLS *tls.Config
	// Logger receives the server's logs. Default: discard.
	Logger *slog.Logger
	// Now is the clock requests are checked and messages stamped with.
	// Default time.Now.
	Now func() time.Time
	// KeyRefresh bounds how often an unknown account or a refused
	// signature makes the server fetch the tenants' keys again. Default 1s.
	KeyRefresh time.Duration
}

// Server serves the Azure Queue REST API over a Tabula cluster:
// path-style addressing (/account/queue/messages), accounts are tenants
// and their keys the tenants' keys, an account's queues and messages are
// records of one ordered table of its tenant (StoreTable). It keeps no
// state of its own beyond caches: run as many as wanted.
//
// A Server is safe for concurrent use.
type Server struct {
	opts Options
	log  *slog.Logger
	keys *tenantkeys.Cache // the tenants' keys, shared code with the Table gateway

	mu sync.Mutex
	// Guarded by mu.
	accounts map[string]*store
	closed   bool
}

// New returns a queue server for the cluster at opts.Masters.
func New(ctx context.Context, opts Options) (*Server, error) {
	if len(opts.Masters) == 0 {
		return nil, errors.New("queue: no master addresses")
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
	keys, err := tenantkeys.New(tenantkeys.Options{Masters: opts.Masters, Credential: opts.Credential, TLS: opts.TLS, Refresh: opts.KeyRefresh, Now: opts.Now})
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger, keys: keys, accounts: map[string]*store{}}
	if err := keys.Refresh(ctx, true); err != nil {
		s.log.Warn("could not read the tenants' keys yet; retrying on the first request", "err", err)
	}
	return s, nil
}

// Close ends the server's connections. Requests in flight fail.
// Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	accts := s.accounts
	s.accounts = nil
	s.mu.Unlock()
	var errs []error
	for _, a := range accts {
		errs = append(errs, a.c.Close())
	}
	errs = append(errs, s.keys.Close())
	return errors.Join(errs...)
}

// account returns the account's store, making its client on first use.
func (s *Server) account(name string) (*store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, newErr(http.StatusServiceUnavailable, "ServerBusy", "The server is shutting down.")
	}
	if a := s.accounts[name]; a != nil {
		return a, nil
	}
	c, err := client.New(context.Background(), client.Options{Masters: s.opts.Masters, Credential: s.opts.Credential,
		Tenant: name, TLS: s.opts.TLS, Logger: s.log})
	if err != nil {
		return nil, err
	}
	a := &store{c: c, now: s.opts.Now}
	s.accounts[name] = a
	return a, nil
}

// request is one request being served.
type request struct {
	s       *Server
	w       http.ResponseWriter
	r       *http.Request
	id      string
	now     time.Time
	base    string // the account's URL
	account string
	st      *store
	p       sharedkey.Principal
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var idb [16]byte
	_, _ = rand.Read(idb[:])
	q := &request{s: s, w: w, r: r, id: formatID(idb), now: s.opts.Now()}
	h := w.Header()
	h.Set("x-ms-request-id", q.id)
	h.Set("Date", q.now.UTC().Format(http.TimeFormat))
	h.Set("Server", "Tabula-Queue")
	if v := r.Header.Get("x-ms-client-request-id"); v != "" {
		h.Set("x-ms-client-request-id", v)
	}
	version := r.Header.Get("x-ms-version")
	if version == "" {
		version = DefaultVersion
	} else if _, err := time.Parse("2006-01-02", version); err != nil {
		h.Set("x-ms-version", DefaultVersion)
		q.fail(newErr(http.StatusBadRequest, "InvalidHeaderValue", fmt.Sprintf("The value for one of the HTTP headers is not in the correct format (x-ms-version %q).", version)))
		return
	}
	h.Set("x-ms-version", version)
	path := strings.TrimPrefix(r.URL.EscapedPath(), "/")
	acct, rest, _ := strings.Cut(path, "/")
	if acct == "" {
		q.fail(errInvalidURI("/"))
		return
	}
	rest, err := url.PathUnescape(rest)
	if err != nil {
		q.fail(errInvalidURI(rest))
		return
	}
	parts := strings.Split(rest, "/")
	if rest == "" {
		parts = nil
	}
	if len(parts) > 3 || len(parts) >= 2 && parts[1] != "messages" {
		q.fail(errInvalidURI(r.URL.Path))
		return
	}
	queue := ""
	if len(parts) > 0 {
		queue = parts[0]
		if err := validQueueName(queue); err != nil {
			q.fail(err)
			return
		}
	}
	if r.Method == http.MethodOptions {
		q.fail(newErr(http.StatusForbidden, "CorsPreflightFailure", "CORS is not supported by this server."))
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	q.base = scheme + "://" + r.Host + "/" + acct
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout(r))
	defer cancel()
	name := strings.TrimSuffix(acct, secondarySuffix)
	policies := func(queueName, id string) (accessPolicy, bool, error) {
		st, err := s.account(name)
		if err != nil {
			return accessPolicy{}, false, err
		}
		rec, _, err := st.queue(ctx, queueName)
		if err != nil || rec == nil {
			return accessPolicy{}, false, err
		}
		for _, p := range rec.ACL {
			if p.ID == id {
				return p, true, nil
			}
		}
		return accessPolicy{}, false, nil
	}
	p, err := verify(r, acct, queue, s.keys, policies, q.now)
	if err != nil {
		if se := toSvc(err); se.code == sharedkey.CodeAuthenticationFailed {
			// Perhaps a new tenant or a rotated key: read the keys again.
			if rerr := s.keys.Refresh(ctx, false); rerr == nil {
				p, err = verify(r, acct, queue, s.keys, policies, q.now)
			}
		}
		if err != nil {
			q.fail(err)
			return
		}
	}
	q.p, q.account = p, p.Account
	if p.Secondary && r.Method != http.MethodGet && r.Method != http.MethodHead {
		q.fail(newErr(http.StatusForbidden, "AuthorizationFailure", "Write operations are not allowed on the secondary location."))
		return
	}
	if q.st, err = s.account(q.account); err != nil {
		q.fail(err)
		return
	}
	q.route(ctx, queue, parts)
}

// requestTimeout is the request's timeout parameter (seconds), capped at
// 30 s, the service's limit and default.
func requestTimeout(r *http.Request) time.Duration {
	d := 30 * time.Second
	if n, err := strconv.Atoi(r.URL.Query().Get("timeout")); err == nil && n > 0 && time.Duration(n)*time.Second < d {
		d = time.Duration(n) * time.Second
	}
	return d
}

func (q *request) route(ctx context.Context, queue string, parts []string) {
	qs := q.r.URL.Query()
	m := q.r.Method
	comp, restype := qs.Get("comp"), qs.Get("restype")
	switch len(parts) {
	case 0:
		switch {
		case comp == "list" && m == http.MethodGet:
			q.listQueues(ctx)
		case restype == "service" && comp == "properties" && m == http.MethodGet:
			q.getServiceProperties(ctx)
		case restype == "service" && comp == "properties" && m == http.MethodPut:
			q.setServiceProperties(ctx)
		case restype == "service" && comp == "stats" && m == http.MethodGet:
			q.serviceStats()
		default:
			q.fail(errInvalidURI(q.r.URL.Path))
		}
	case 1:
		switch {
		case comp == "" && m == http.MethodPut:
			q.createQueue(ctx, queue)
		case comp == "" && m == http.MethodDelete:
			q.deleteQueue(ctx, queue)
		case comp == "metadata" && (m == http.MethodGet || m == http.MethodHead):
			q.getMetadata(ctx, queue)
		case comp == "metadata" && m == http.MethodPut:
			q.setMetadata(ctx, queue)
		case comp == "acl" && (m == http.MethodGet || m == http.MethodHead):
			q.getACL(ctx, queue)
		case comp == "acl" && m == http.MethodPut:
			q.setACL(ctx, queue)
		default:
			q.fail(errMethod)
		}
	case 2:
		switch m {
		case http.MethodPost:
			q.putMessage(ctx, queue)
		case http.MethodGet:
			if strings.EqualFold(qs.Get("peekonly"), "true") {
				q.peekMessages(ctx, queue)
			} else {
				q.getMessages(ctx, queue)
			}
		case http.MethodDelete:
			q.clearMessages(ctx, queue)
		default:
			q.fail(errMethod)
		}
	case 3:
		switch m {
		case http.MethodDelete:
			q.deleteMessage(ctx, queue, parts[2])
		case http.MethodPut:
			q.updateMessage(ctx, queue, parts[2])
		default:
			q.fail(errMethod)
		}
	}
}

// fail answers err as the service does: its status, x-ms-error-code, and
// an XML body (none for HEAD).
func (q *request) fail(err error) {
	e := toSvc(err)
	if e.status >= 500 {
		q.s.log.Warn("queue request failed", "method", q.r.Method, "path", q.r.URL.Path, "request_id", q.id, "err", err)
	}
	h := q.w.Header()
	h.Set("x-ms-error-code", e.code)
	if q.r.Method == http.MethodHead {
		q.w.WriteHeader(e.status)
		return
	}
	h.Set("Content-Type", "application/xml")
	q.w.WriteHeader(e.status)
	_, _ = q.w.Write(errorXML(e, q.id, q.now))
}

func (q *request) allow(o op, queue string) bool {
	if err := allows(q.p, o, queue); err != nil {
		q.fail(err)
		return false
	}
	return true
}

func (q *request) writeXML(status int, body []byte) {
	q.w.Header().Set("Content-Type", "application/xml")
	q.w.WriteHeader(status)
	if q.r.Method != http.MethodHead {
		_, _ = q.w.Write(body)
	}
}

func (q *request) body() ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(q.r.Body, maxBody+1))
	if err != nil {
		return nil, newErr(http.StatusBadRequest, "InvalidInput", "The request body could not be read: "+err.Error())
	}
	if len(b) > maxBody {
		return nil, errBodyTooLarge
	}
	return b, nil
}

// Service.

func (q *request) listQueues(ctx context.Context) {
	if !q.allow(opListQueues, "") {
		return
	}
	qs := q.r.URL.Query()
	limit, err := intParam(qs, "maxresults", 1, 1<<31-1, maxListResults)
	if err != nil {
		q.fail(err)
		return
	}
	limit = min(limit, maxListResults)
	items, next, err := q.st.listQueues(ctx, qs.Get("prefix"), qs.Get("marker"), int(limit))
	if err != nil {
		q.fail(err)
		return
	}
	withMeta := false
	for _, inc := range strings.Split(qs.Get("include"), ",") {
		withMeta = withMeta || strings.TrimSpace(inc) == "metadata"
	}
	out := xmlQueueList{ServiceEndpoint: q.base + "/", Prefix: qs.Get("prefix"), Marker: qs.Get("marker"), NextMarker: next, Queues: []xmlQueue{}}
	if _, ok := qs["maxresults"]; ok {
		out.MaxResults = int(limit)
	}
	for _, it := range items {
		x := xmlQueue{Name: it.Name}
		if withMeta {
			x.Metadata = &xmlMetadata{}
			for _, p := range it.Metadata {
				x.Metadata.Items = append(x.Metadata.Items, xmlMetaItem{XMLName: xml.Name{Local: p.Name}, Value: p.Value})
			}
		}
		out.Queues = append(out.Queues, x)
	}
	q.writeXML(http.StatusOK, marshalXML(out))
}

func (q *request) getServiceProperties(ctx context.Context) {
	if !q.allow(opGetServiceProperties, "") {
		return
	}
	p := defaultServiceProps()
	cur, err := q.st.serviceProperties(ctx)
	if err != nil {
		q.fail(err)
		return
	}
	if cur != nil {
		stored, err := decodeServiceProps(cur)
		if err != nil {
			q.fail(fmt.Errorf("read the queue service properties: %w: %v", ErrCorrupt, err))
			return
		}
		p.merge(stored)
	}
	q.writeXML(http.StatusOK, marshalXML(p))
}

func (q *request) setServiceProperties(ctx context.Context) {
	if !q.allow(opSetServiceProperties, "") {
		return
	}
	b, err := q.body()
	if err != nil {
		q.fail(err)
		return
	}
	set, err := decodeServiceProps(b)
	if err != nil {
		q.fail(err)
		return
	}
	err = q.st.setServiceProperties(ctx, func(cur []byte) ([]byte, error) {
		p := defaultServiceProps()
		if cur != nil {
			stored, err := decodeServiceProps(cur)
			if err != nil {
				return nil, fmt.Errorf("read the queue service properties: %w: %v", ErrCorrupt, err)
			}
			p.merge(stored)
		}
		p.merge(set)
		return marshalXML(p), nil
	})
	if err != nil {
		q.fail(err)
		return
	}
	q.w.WriteHeader(http.StatusAccepted)
}

func (q *request) serviceStats() {
	if !q.allow(opGetServiceStats, "") {
		return
	}
	if !q.p.Secondary {
		q.fail(newErr(http.StatusBadRequest, "InvalidQueryParameterValue", "Service statistics are served on the secondary location only (account-secondary)."))
		return
	}
	q.writeXML(http.StatusOK, []byte(`<?xml version="1.0" encoding="utf-8"?><StorageServiceStats><GeoReplication><Status>live</Status><LastSyncTime>`+
		q.now.UTC().Format(http.TimeFormat)+`</LastSyncTime></GeoReplication></StorageServiceStats>`))
}

// Queues.

func (q *request) createQueue(ctx context.Context, queue string) {
	if !q.allow(opCreateQueue, queue) {
		return
	}
	created, err := q.st.createQueue(ctx, queue, metadataOf(q.r))
	if err != nil {
		q.fail(err)
		return
	}
	if created {
		q.w.WriteHeader(http.StatusCreated)
	} else {
		q.w.WriteHeader(http.StatusNoContent)
	}
}

func (q *request) deleteQueue(ctx context.Context, queue string) {
	if !q.allow(opDeleteQueue, queue) {
		return
	}
	if err := q.st.deleteQueue(ctx, queue); err != nil {
		q.fail(err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}

func (q *request) getMetadata(ctx context.Context, queue string) {
	if !q.allow(opGetQueueMetadata, queue) {
		return
	}
	rec, _, err := q.st.mustQueue(ctx, queue)
	if err != nil {
		q.fail(err)
		return
	}
	n, err := q.st.countMessages(ctx, queue, rec.Gen)
	if err != nil {
		q.fail(err)
		return
	}
	h := q.w.Header()
	h.Set("x-ms-approximate-messages-count", strconv.Itoa(n))
	for _, p := range rec.Metadata {
		h.Set("x-ms-meta-"+p.Name, p.Value)
	}
	q.w.WriteHeader(http.StatusOK)
}

func (q *request) setMetadata(ctx context.Context, queue string) {
	if !q.allow(opSetQueueMetadata, queue) {
		return
	}
	meta := metadataOf(q.r)
	if err := q.st.updateQueue(ctx, queue, func(r *queueRecord) { r.Metadata = meta }); err != nil {
		q.fail(err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}

func (q *request) getACL(ctx context.Context, queue string) {
	if !q.allow(opGetQueueACL, queue) {
		return
	}
	rec, _, err := q.st.mustQueue(ctx, queue)
	if err != nil {
		q.fail(err)
		return
	}
	q.writeXML(http.StatusOK, encodeACL(rec.ACL))
}

func (q *request) setACL(ctx context.Context, queue string) {
	if !q.allow(opSetQueueACL, queue) {
		return
	}
	b, err := q.body()
	if err != nil {
		q.fail(err)
		return
	}
	acl, err := decodeACL(b)
	if err != nil {
		q.fail(err)
		return
	}
	if err := q.st.updateQueue(ctx, queue, func(r *queueRecord) { r.ACL = acl }); err != nil {
		q.fail(err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}

// Messages.

// messageText reads a body's MessageText, checking its size.
func (q *request) messageText(required bool) (string, bool, error) {
	b, err := q.body()
	if err != nil {
		return "", false, err
	}
	text, ok, err := decodeMessageText(b)
	if err != nil {
		return "", false, err
	}
	if !ok && required {
		return "", false, errInvalidXML
	}
	if textSize(text) > maxMessageText {
		return "", false, errBodyTooLarge
	}
	return text, ok, nil
}

func (q *request) putMessage(ctx context.Context, queue string) {
	if !q.allow(opPutMessage, queue) {
		return
	}
	vis, ttl, err := putParams(q.r.URL.Query())
	if err != nil {
		q.fail(err)
		return
	}
	text, _, err := q.messageText(true)
	if err != nil {
		q.fail(err)
		return
	}
	m, err := q.st.putMessage(ctx, queue, text, vis, ttl)
	if err != nil {
		q.fail(err)
		return
	}
	q.writeXML(http.StatusCreated, marshalXML(xmlMessageList{Messages: []xmlMessage{messageXML(m, opPutMessage)}}))
}

func (q *request) getMessages(ctx context.Context, queue string) {
	if !q.allow(opGetMessages, queue) {
		return
	}
	qs := q.r.URL.Query()
	n, err := intParam(qs, "numofmessages", 1, maxNumMessages, 1)
	if err != nil {
		q.fail(err)
		return
	}
	vt, err := intParam(qs, "visibilitytimeout", 1, maxVisibility, defaultDequeueVT)
	if err != nil {
		q.fail(err)
		return
	}
	ms, err := q.st.getMessages(ctx, queue, int(n), time.Duration(vt)*time.Second)
	if err != nil {
		q.fail(err)
		return
	}
	out := xmlMessageList{Messages: []xmlMessage{}}
	for _, m := range ms {
		out.Messages = append(out.Messages, messageXML(m, opGetMessages))
	}
	q.writeXML(http.StatusOK, marshalXML(out))
}

func (q *request) peekMessages(ctx context.Context, queue string) {
	if !q.allow(opPeekMessages, queue) {
		return
	}
	n, err := intParam(q.r.URL.Query(), "numofmessages", 1, maxNumMessages, 1)
	if err != nil {
		q.fail(err)
		return
	}
	ms, err := q.st.peekMessages(ctx, queue, int(n))
	if err != nil {
		q.fail(err)
		return
	}
	out := xmlMessageList{Messages: []xmlMessage{}}
	for _, m := range ms {
		out.Messages = append(out.Messages, messageXML(m, opPeekMessages))
	}
	q.writeXML(http.StatusOK, marshalXML(out))
}

func (q *request) clearMessages(ctx context.Context, queue string) {
	if !q.allow(opClearMessages, queue) {
		return
	}
	if err := q.st.clearMessages(ctx, queue); err != nil {
		q.fail(err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}

// popReceipt reads the popreceipt parameter.
func (q *request) popReceipt() (string, error) {
	v, ok := q.r.URL.Query()["popreceipt"]
	if !ok {
		return "", errMissingQuery("popreceipt")
	}
	return v[0], nil
}

func (q *request) deleteMessage(ctx context.Context, queue, idText string) {
	if !q.allow(opDeleteMessage, queue) {
		return
	}
	receipt, err := q.popReceipt()
	if err != nil {
		q.fail(err)
		return
	}
	id, ok := parseID(idText)
	if !ok {
		q.fail(errMessageNotFound)
		return
	}
	if _, err := q.st.changeMessage(ctx, queue, id, receipt, func(*messageRecord, int64) *messageRecord { return nil }); err != nil {
		q.fail(err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}

func (q *request) updateMessage(ctx context.Context, queue, idText string) {
	if !q.allow(opUpdateMessage, queue) {
		return
	}
	receipt, err := q.popReceipt()
	if err != nil {
		q.fail(err)
		return
	}
	qs := q.r.URL.Query()
	if !qs.Has("visibilitytimeout") {
		q.fail(errMissingQuery("visibilitytimeout"))
		return
	}
	vt, err := intParam(qs, "visibilitytimeout", 0, maxVisibility, 0)
	if err != nil {
		q.fail(err)
		return
	}
	text, setText, err := q.messageText(false)
	if err != nil {
		q.fail(err)
		return
	}
	id, ok := parseID(idText)
	if !ok {
		q.fail(errMessageNotFound)
		return
	}
	next, err := q.st.changeMessage(ctx, queue, id, receipt, func(m *messageRecord, now int64) *messageRecord {
		n := *m
		n.Visible = now + vt*1000
		n.Receipt = newReceipt()
		if setText {
			n.Text = text
		}
		return &n
	})
	if err != nil {
		q.fail(err)
		return
	}
	h := q.w.Header()
	h.Set("x-ms-popreceipt", next.Receipt)
	h.Set("x-ms-time-next-visible", httpTime(next.Visible))
	q.w.WriteHeader(http.StatusNoContent)
}
