package queue_test

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/frontend/queue"
	"github.com/tabuladb/tabula/frontend/sharedkey"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// clock is a settable test clock.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// env is a test's queue service: an account, its key, the clock.
type env struct {
	t       *testing.T
	url     string // the account's URL
	account string
	key     []byte
	clock   *clock
	tc      *testcluster.Cluster
}

func start(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tc.Close() })
	cc, err := grpc.NewClient(tc.MasterAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := api.NewMasterClient(cc).CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "acct"})
	if err != nil {
		t.Fatal(err)
	}
	ck := &clock{}
	ck.ns.Store(time.Now().UnixNano())
	qs, err := queue.New(ctx, queue.Options{Masters: tc.MasterAddrs(), Credential: tc.Credential(), Now: ck.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = qs.Close() })
	srv := httptest.NewServer(qs)
	t.Cleanup(srv.Close)
	return &env{t: t, url: srv.URL + "/acct", account: "acct", key: resp.GetTenant().GetKeys()[0], clock: ck, tc: tc}
}

// do sends a request signed with Shared Key (the queue form) and returns
// status, headers and body.
func (e *env) do(method, path, query, body string, hdr ...string) (int, http.Header, string) {
	e.t.Helper()
	return e.send(method, path, query, body, func(r *http.Request) { queue.SignSharedKey(r, e.account, e.key) }, hdr...)
}

func (e *env) send(method, path, query, body string, sign func(*http.Request), hdr ...string) (int, http.Header, string) {
	e.t.Helper()
	u := e.url + path
	if query != "" {
		u += "?" + query
	}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r, err := http.NewRequest(method, u, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	r.Header.Set("x-ms-version", "2019-12-12")
	r.Header.Set("x-ms-date", e.clock.now().UTC().Format(http.TimeFormat))
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	if body != "" {
		r.Header.Set("Content-Type", "application/xml")
	}
	if sign != nil {
		sign(r)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// must checks a status.
func (e *env) must(want int, method, path, query, body string, hdr ...string) (http.Header, string) {
	e.t.Helper()
	st, h, b := e.do(method, path, query, body, hdr...)
	if st != want {
		e.t.Fatalf("%s %s?%s: status %d, want %d: %s", method, path, query, st, want, b)
	}
	return h, b
}

// wantCode checks an error's status and code.
func (e *env) wantCode(status int, code string, method, path, query, body string) {
	e.t.Helper()
	st, h, b := e.do(method, path, query, body)
	if st != status || h.Get("x-ms-error-code") != code {
		e.t.Fatalf("%s %s?%s: %d %s, want %d %s: %s", method, path, query, st, h.Get("x-ms-error-code"), status, code, b)
	}
}

type msg struct {
	MessageID       string `xml:"MessageId"`
	InsertionTime   string
	ExpirationTime  string
	PopReceipt      string
	TimeNextVisible string
	DequeueCount    int
	MessageText     string
}

type msgList struct {
	Messages []msg `xml:"QueueMessage"`
}

func parseMsgs(t *testing.T, body string) []msg {
	t.Helper()
	var l msgList
	if err := xml.Unmarshal([]byte(body), &l); err != nil {
		t.Fatalf("decode %q: %v", body, err)
	}
	return l.Messages
}

func body(text string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(text))
	return "<QueueMessage><MessageText>" + b.String() + "</MessageText></QueueMessage>"
}

func (e *env) put(q, text, query string) msg {
	e.t.Helper()
	_, b := e.must(http.StatusCreated, "POST", "/"+q+"/messages", query, body(text))
	ms := parseMsgs(e.t, b)
	if len(ms) != 1 || ms[0].PopReceipt == "" || ms[0].MessageID == "" {
		e.t.Fatalf("put answered %q", b)
	}
	return ms[0]
}

func (e *env) get(q, query string) []msg {
	e.t.Helper()
	_, b := e.must(http.StatusOK, "GET", "/"+q+"/messages", query, "")
	return parseMsgs(e.t, b)
}

func TestQueueLifecycle(t *testing.T) {
	e := start(t)
	e.must(http.StatusCreated, "PUT", "/orders", "", "", "x-ms-meta-Color", "blue")
	e.must(http.StatusNoContent, "PUT", "/orders", "", "", "x-ms-meta-color", "blue") // same metadata: 204
	e.wantCode(http.StatusConflict, "QueueAlreadyExists", "PUT", "/orders", "", "")
	e.must(http.StatusCreated, "PUT", "/other", "", "")

	h, _ := e.must(http.StatusOK, "GET", "/orders", "comp=metadata", "")
	if h.Get("x-ms-meta-color") != "blue" || h.Get("x-ms-approximate-messages-count") != "0" {
		t.Fatalf("metadata headers %v", h)
	}
	e.must(http.StatusNoContent, "PUT", "/orders", "comp=metadata", "", "x-ms-meta-size", "10")
	h, _ = e.must(http.StatusOK, "HEAD", "/orders", "comp=metadata", "")
	if h.Get("x-ms-meta-size") != "10" || h.Get("x-ms-meta-color") != "" {
		t.Fatalf("metadata after set: %v", h)
	}

	_, b := e.must(http.StatusOK, "GET", "", "comp=list&include=metadata", "")
	if !strings.Contains(b, "<Name>orders</Name><Metadata><size>10</size></Metadata>") || !strings.Contains(b, "<Name>other</Name>") {
		t.Fatalf("list: %s", b)
	}
	_, b = e.must(http.StatusOK, "GET", "", "comp=list&maxresults=1", "")
	if !strings.Contains(b, "<Name>orders</Name>") || strings.Contains(b, "<Name>other</Name>") || !strings.Contains(b, "<NextMarker>other</NextMarker>") {
		t.Fatalf("first page: %s", b)
	}
	_, b = e.must(http.StatusOK, "GET", "", "comp=list&maxresults=1&marker=other", "")
	if !strings.Contains(b, "<Name>other</Name>") || !strings.Contains(b, "<NextMarker></NextMarker>") {
		t.Fatalf("second page: %s", b)
	}
	_, b = e.must(http.StatusOK, "GET", "", "comp=list&prefix=ot", "")
	if strings.Contains(b, "orders") || !strings.Contains(b, "<Name>other</Name>") {
		t.Fatalf("prefix: %s", b)
	}

	acl := `<SignedIdentifiers><SignedIdentifier><Id>p1</Id><AccessPolicy><Start>2020-01-01T00:00:00Z</Start><Expiry>2099-01-01T00:00:00Z</Expiry><Permission>raup</Permission></AccessPolicy></SignedIdentifier></SignedIdentifiers>`
	e.must(http.StatusNoContent, "PUT", "/orders", "comp=acl", acl)
	_, b = e.must(http.StatusOK, "GET", "/orders", "comp=acl", "")
	if !strings.Contains(b, "<Id>p1</Id>") || !strings.Contains(b, "<Permission>raup</Permission>") {
		t.Fatalf("acl: %s", b)
	}
	e.wantCode(http.StatusBadRequest, "InvalidXmlDocument", "PUT", "/orders", "comp=acl", strings.Replace(acl, "raup", "rwx", 1))

	e.put("orders", "one", "")
	e.must(http.StatusNoContent, "DELETE", "/orders", "", "")
	e.wantCode(http.StatusNotFound, "QueueNotFound", "DELETE", "/orders", "", "")
	e.wantCode(http.StatusNotFound, "QueueNotFound", "GET", "/orders", "comp=metadata", "")
	e.wantCode(http.StatusNotFound, "QueueNotFound", "POST", "/orders/messages", "", body("x"))
	// A queue made again under the name starts empty.
	e.must(http.StatusCreated, "PUT", "/orders", "", "")
	if ms := e.get("orders", "peekonly=true&numofmessages=32"); len(ms) != 0 {
		t.Fatalf("recreated queue has %d messages", len(ms))
	}
	e.wantCode(http.StatusBadRequest, "InvalidResourceName", "PUT", "/Bad_Name", "", "")
	e.wantCode(http.StatusBadRequest, "InvalidResourceName", "PUT", "/a--b", "", "")
	e.wantCode(http.StatusBadRequest, "OutOfRangeInput", "PUT", "/ab", "", "")
}

func TestMessages(t *testing.T) {
	e := start(t)
	e.must(http.StatusCreated, "PUT", "/qq1", "", "")
	m1 := e.put("qq1", "first <&> message", "")
	e.put("qq1", "second", "")
	e.put("qq1", "", "")

	peek := e.get("qq1", "peekonly=true&numofmessages=32")
	if len(peek) != 3 || peek[0].MessageText != "first <&> message" || peek[0].PopReceipt != "" || peek[0].DequeueCount != 0 {
		t.Fatalf("peek: %+v", peek)
	}
	got := e.get("qq1", "numofmessages=2&visibilitytimeout=10")
	if len(got) != 2 || got[0].MessageID != m1.MessageID || got[0].DequeueCount != 1 || got[0].PopReceipt == m1.PopReceipt || got[1].MessageText != "second" {
		t.Fatalf("get: %+v", got)
	}
	// Hidden for their visibility timeout: the next get finds the third.
	if rest := e.get("qq1", "numofmessages=32"); len(rest) != 1 || rest[0].MessageText != "" {
		t.Fatalf("get while hidden: %+v", rest)
	}
	h, _ := e.must(http.StatusOK, "GET", "/qq1", "comp=metadata", "")
	if h.Get("x-ms-approximate-messages-count") != "3" {
		t.Fatalf("count %q", h.Get("x-ms-approximate-messages-count"))
	}

	// Delete: a stale receipt is refused, the current one works.
	e.wantCode(http.StatusBadRequest, "PopReceiptMismatch", "DELETE", "/qq1/messages/"+got[0].MessageID, "popreceipt="+url.QueryEscape(m1.PopReceipt), "")
	e.wantCode(http.StatusBadRequest, "MissingRequiredQueryParameter", "DELETE", "/qq1/messages/"+got[0].MessageID, "", "")
	e.must(http.StatusNoContent, "DELETE", "/qq1/messages/"+got[0].MessageID, "popreceipt="+url.QueryEscape(got[0].PopReceipt), "")
	e.wantCode(http.StatusNotFound, "MessageNotFound", "DELETE", "/qq1/messages/"+got[0].MessageID, "popreceipt="+url.QueryEscape(got[0].PopReceipt), "")
	e.wantCode(http.StatusNotFound, "MessageNotFound", "DELETE", "/qq1/messages/not-an-id", "popreceipt=x", "")

	// Update: new text, visible at once, a new receipt.
	h, _ = e.must(http.StatusNoContent, "PUT", "/qq1/messages/"+got[1].MessageID, "popreceipt="+url.QueryEscape(got[1].PopReceipt)+"&visibilitytimeout=0", body("second, edited"))
	if h.Get("x-ms-popreceipt") == "" || h.Get("x-ms-popreceipt") == got[1].PopReceipt || h.Get("x-ms-time-next-visible") == "" {
		t.Fatalf("update headers %v", h)
	}
	e.wantCode(http.StatusBadRequest, "PopReceiptMismatch", "PUT", "/qq1/messages/"+got[1].MessageID, "popreceipt="+url.QueryEscape(got[1].PopReceipt)+"&visibilitytimeout=0", "")
	if again := e.get("qq1", "numofmessages=32"); len(again) != 1 || again[0].MessageText != "second, edited" || again[0].DequeueCount != 2 {
		t.Fatalf("after update: %+v", again)
	}

	// Clear.
	e.must(http.StatusNoContent, "DELETE", "/qq1/messages", "", "")
	if ms := e.get("qq1", "peekonly=true&numofmessages=32"); len(ms) != 0 {
		t.Fatalf("after clear: %+v", ms)
	}

	// Limits and parameters.
	e.wantCode(http.StatusBadRequest, "OutOfRangeQueryParameterValue", "GET", "/qq1/messages", "numofmessages=33", "")
	e.wantCode(http.StatusBadRequest, "OutOfRangeQueryParameterValue", "GET", "/qq1/messages", "numofmessages=0", "")
	e.wantCode(http.StatusBadRequest, "OutOfRangeQueryParameterValue", "GET", "/qq1/messages", "visibilitytimeout=0", "")
	e.wantCode(http.StatusBadRequest, "InvalidQueryParameterValue", "POST", "/qq1/messages", "visibilitytimeout=10&messagettl=5", body("x"))
	e.wantCode(http.StatusBadRequest, "InvalidXmlDocument", "POST", "/qq1/messages", "", "<QueueMessage></QueueMessage>")
	e.wantCode(http.StatusBadRequest, "InvalidXmlDocument", "POST", "/qq1/messages", "", "not xml")
	e.wantCode(http.StatusRequestEntityTooLarge, "RequestBodyTooLarge", "POST", "/qq1/messages", "", body(strings.Repeat("a", 64<<10+1)))
	e.put("qq1", strings.Repeat("a", 64<<10), "")
}

func TestGetMessagesAtMost32(t *testing.T) {
	e := start(t)
	e.must(http.StatusCreated, "PUT", "/many", "", "")
	for i := range 40 {
		e.put("many", fmt.Sprint(i), "")
	}
	got := e.get("many", "numofmessages=32")
	if len(got) != 32 {
		t.Fatalf("got %d messages, want 32", len(got))
	}
	for i, m := range got {
		if m.MessageText != fmt.Sprint(i) {
			t.Fatalf("message %d is %q: not in insertion order", i, m.MessageText)
		}
	}
	if rest := e.get("many", "numofmessages=32"); len(rest) != 8 {
		t.Fatalf("second get: %d messages, want 8", len(rest))
	}
}

func TestVisibilityAndRedelivery(t *testing.T) {
	e := start(t)
	e.must(http.StatusCreated, "PUT", "/vqq", "", "")
	// Put invisible for 5 s: nobody sees it before.
	e.put("vqq", "later", "visibilitytimeout=5")
	if ms := e.get("vqq", ""); len(ms) != 0 {
		t.Fatalf("invisible message delivered: %+v", ms)
	}
	e.clock.advance(5 * time.Second)
	first := e.get("vqq", "visibilitytimeout=30")
	if len(first) != 1 || first[0].DequeueCount != 1 {
		t.Fatalf("first delivery: %+v", first)
	}
	e.clock.advance(29 * time.Second)
	if ms := e.get("vqq", ""); len(ms) != 0 {
		t.Fatalf("delivered again within its visibility window: %+v", ms)
	}
	// The consumer neither deleted nor updated it: delivered again, with
	// a new receipt; the old receipt no longer deletes it.
	e.clock.advance(time.Second)
	second := e.get("vqq", "")
	if len(second) != 1 || second[0].DequeueCount != 2 || second[0].PopReceipt == first[0].PopReceipt || second[0].MessageID != first[0].MessageID {
		t.Fatalf("redelivery: %+v", second)
	}
	e.wantCode(http.StatusBadRequest, "PopReceiptMismatch", "DELETE", "/vqq/messages/"+first[0].MessageID, "popreceipt="+url.QueryEscape(first[0].PopReceipt), "")
	e.must(http.StatusNoContent, "DELETE", "/vqq/messages/"+second[0].MessageID, "popreceipt="+url.QueryEscape(second[0].PopReceipt), "")
}

func TestTTL(t *testing.T) {
	e := start(t)
	e.must(http.StatusCreated, "PUT", "/tqq", "", "")
	short := e.put("tqq", "short", "messagettl=10")
	forever := e.put("tqq", "forever", "messagettl=-1")
	if forever.ExpirationTime != "Fri, 31 Dec 9999 23:59:59 GMT" {
		t.Fatalf("never-expiring message expires %q", forever.ExpirationTime)
	}
	ins, _ := http.ParseTime(short.InsertionTime)
	exp, _ := http.ParseTime(short.ExpirationTime)
	if exp.Sub(ins) != 10*time.Second {
		t.Fatalf("ttl 10 s gave %s..%s", short.InsertionTime, short.ExpirationTime)
	}
	got := e.get("tqq", "numofmessages=2&visibilitytimeout=1")
	if len(got) != 2 {
		t.Fatalf("got %d", len(got))
	}
	e.clock.advance(11 * time.Second)
	ms := e.get("tqq", "peekonly=true&numofmessages=32")
	if len(ms) != 1 || ms[0].MessageText != "forever" {
		t.Fatalf("after expiry: %+v", ms)
	}
	e.wantCode(http.StatusNotFound, "MessageNotFound", "DELETE", "/tqq/messages/"+got[0].MessageID, "popreceipt="+url.QueryEscape(got[0].PopReceipt), "")
	h, _ := e.must(http.StatusOK, "GET", "/tqq", "comp=metadata", "")
	if h.Get("x-ms-approximate-messages-count") != "1" {
		t.Fatalf("count after expiry %q", h.Get("x-ms-approximate-messages-count"))
	}
}

// TestConcurrentConsumers: consumers racing on one queue never receive
// one message twice within a visibility window, and together receive
// every message.
func TestConcurrentConsumers(t *testing.T) {
	e := start(t)
	e.must(http.StatusCreated, "PUT", "/cqq", "", "")
	const n = 60
	for i := range n {
		e.put("cqq", fmt.Sprint(i), "")
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				st, _, b := e.do("GET", "/cqq/messages", "numofmessages=5&visibilitytimeout=600", "")
				if st != http.StatusOK {
					t.Errorf("get: %d %s", st, b)
					return
				}
				var l msgList
				if err := xml.Unmarshal([]byte(b), &l); err != nil {
					t.Errorf("decode: %v", err)
					return
				}
				if len(l.Messages) == 0 {
					return
				}
				mu.Lock()
				for _, m := range l.Messages {
					seen[m.MessageID]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("consumers received %d distinct messages, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("message %s delivered %d times within one visibility window", id, c)
		}
	}
}

// TestSurvivesServerFailover: a message acknowledged by Put is delivered
// after the table server holding it is killed.
func TestSurvivesServerFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a table server")
	}
	e := start(t)
	e.must(http.StatusCreated, "PUT", "/fqq", "", "")
	for i := range 5 {
		e.put("fqq", fmt.Sprint(i), "")
	}
	if err := e.tc.KillServer(0); err != nil {
		t.Fatal(err)
	}
	var got []msg
	deadline := time.Now().Add(45 * time.Second)
	for len(got) < 5 && time.Now().Before(deadline) {
		st, _, b := e.do("GET", "/fqq/messages", "numofmessages=32", "")
		if st == http.StatusOK {
			got = append(got, parseMsgs(t, b)...)
		}
	}
	if len(got) != 5 {
		t.Fatalf("after failover got %d of 5 messages", len(got))
	}
}

func TestAuth(t *testing.T) {
	e := start(t)
	e.must(http.StatusCreated, "PUT", "/aqq", "", "")
	// Shared Key Lite.
	if st, _, b := e.send("GET", "/aqq", "comp=metadata", "", func(r *http.Request) { queue.SignSharedKeyLite(r, e.account, e.key) }); st != http.StatusOK {
		t.Fatalf("shared key lite: %d %s", st, b)
	}
	// Anonymous, a wrong key, an unknown account, a stale date.
	if st, h, _ := e.send("GET", "/aqq", "comp=metadata", "", nil); st != http.StatusForbidden || h.Get("x-ms-error-code") != "AuthenticationFailed" {
		t.Fatalf("anonymous: %d %s", st, h.Get("x-ms-error-code"))
	}
	bad := append([]byte(nil), e.key...)
	bad[0] ^= 1
	if st, h, _ := e.send("GET", "/aqq", "comp=metadata", "", func(r *http.Request) { queue.SignSharedKey(r, e.account, bad) }); st != http.StatusForbidden || h.Get("x-ms-error-code") != "AuthenticationFailed" {
		t.Fatalf("wrong key: %d %s", st, h.Get("x-ms-error-code"))
	}
	stale := func(r *http.Request) {
		r.Header.Set("x-ms-date", e.clock.now().Add(-time.Hour).UTC().Format(http.TimeFormat))
		queue.SignSharedKey(r, e.account, e.key)
	}
	if st, h, _ := e.send("GET", "/aqq", "comp=metadata", "", stale); st != http.StatusForbidden || h.Get("x-ms-error-code") != "AuthenticationFailed" {
		t.Fatalf("stale date: %d %s", st, h.Get("x-ms-error-code"))
	}
	// A signature over other query parameters does not pass.
	tamper := func(r *http.Request) {
		queue.SignSharedKey(r, e.account, e.key)
		r.URL.RawQuery += "&numofmessages=2"
	}
	if st, _, _ := e.send("GET", "/aqq/messages", "", "", tamper); st != http.StatusForbidden {
		t.Fatalf("tampered query: %d", st)
	}

	// SAS: a service SAS for aq with add only puts but does not dequeue.
	sas := func(v url.Values) func(*http.Request) {
		return func(r *http.Request) {
			q := r.URL.Query()
			for k, vs := range v {
				q[k] = vs
			}
			r.URL.RawQuery = q.Encode()
		}
	}
	se := e.clock.now().Add(time.Hour).UTC().Format("2006-01-02T15:04:05Z")
	svc := queue.ServiceSAS(e.account, e.key, "aqq", "a", se, "")
	if st, _, b := e.send("POST", "/aqq/messages", "", body("via sas"), sas(svc)); st != http.StatusCreated {
		t.Fatalf("service SAS put: %d %s", st, b)
	}
	if st, h, _ := e.send("GET", "/aqq/messages", "", "", sas(svc)); st != http.StatusForbidden || h.Get("x-ms-error-code") != "AuthorizationPermissionMismatch" {
		t.Fatalf("service SAS without p dequeued: %d %s", st, h.Get("x-ms-error-code"))
	}
	other := queue.ServiceSAS(e.account, e.key, "other", "raup", se, "")
	if st, _, _ := e.send("POST", "/aqq/messages", "", body("x"), sas(other)); st != http.StatusForbidden {
		t.Fatalf("another queue's SAS: %d", st)
	}
	// A stored access policy grants what the SAS leaves out.
	acl := `<SignedIdentifiers><SignedIdentifier><Id>readers</Id><AccessPolicy><Expiry>` + se + `</Expiry><Permission>rp</Permission></AccessPolicy></SignedIdentifier></SignedIdentifiers>`
	e.must(http.StatusNoContent, "PUT", "/aqq", "comp=acl", acl)
	pol := queue.ServiceSAS(e.account, e.key, "aqq", "", "", "readers")
	if st, _, b := e.send("GET", "/aqq/messages", "", "", sas(pol)); st != http.StatusOK || len(parseMsgs(t, b)) != 1 {
		t.Fatalf("policy SAS get: %d %s", st, b)
	}
	// An account SAS for queues, service level only, lists but does not put.
	acc := queue.AccountSAS(e.account, e.key, "q", "s", "l", se)
	if st, _, b := e.send("GET", "", "comp=list", "", sas(acc)); st != http.StatusOK || !strings.Contains(b, "<Name>aqq</Name>") {
		t.Fatalf("account SAS list: %d %s", st, b)
	}
	if st, h, _ := e.send("POST", "/aqq/messages", "", body("x"), sas(acc)); st != http.StatusForbidden || h.Get("x-ms-error-code") != "AuthorizationResourceTypeMismatch" {
		t.Fatalf("account SAS put: %d %s", st, h.Get("x-ms-error-code"))
	}
	tbl := queue.AccountSAS(e.account, e.key, "t", "sco", "racwdlup", se)
	if st, h, _ := e.send("GET", "", "comp=list", "", sas(tbl)); st != http.StatusForbidden || h.Get("x-ms-error-code") != sharedkey.CodeAuthorizationServiceMismatch {
		t.Fatalf("table-only account SAS: %d %s", st, h.Get("x-ms-error-code"))
	}
	// Secondary is read-only.
	sec := &env{t: t, url: strings.TrimSuffix(e.url, "acct") + "acct-secondary", account: "acct", key: e.key, clock: e.clock}
	sec.must(http.StatusOK, "GET", "/aqq", "comp=metadata", "")
	sec.wantCode(http.StatusForbidden, "AuthorizationFailure", "PUT", "/zz9", "", "")
}

func TestServiceProperties(t *testing.T) {
	e := start(t)
	_, b := e.must(http.StatusOK, "GET", "", "restype=service&comp=properties", "")
	if !strings.Contains(b, "<Logging><Version>1.0</Version>") {
		t.Fatalf("default properties: %s", b)
	}
	set := `<?xml version="1.0" encoding="utf-8"?><StorageServiceProperties><Cors><CorsRule><AllowedOrigins>*</AllowedOrigins><AllowedMethods>GET</AllowedMethods><AllowedHeaders></AllowedHeaders><ExposedHeaders></ExposedHeaders><MaxAgeInSeconds>8888</MaxAgeInSeconds></CorsRule></Cors></StorageServiceProperties>`
	e.must(http.StatusAccepted, "PUT", "", "restype=service&comp=properties", set)
	_, b = e.must(http.StatusOK, "GET", "", "restype=service&comp=properties", "")
	if !strings.Contains(b, "<MaxAgeInSeconds>8888</MaxAgeInSeconds>") || !strings.Contains(b, "<Logging><Version>1.0</Version>") {
		t.Fatalf("properties after set: %s", b)
	}
}
