package sharedkey

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const testDate = "Mon, 06 May 2024 07:08:09 GMT"

var testNow = time.Date(2024, 5, 6, 7, 10, 0, 0, time.UTC)

// Signatures computed outside Go (openssl dgst -sha256 -mac HMAC over the
// documented string-to-sign, with DevKey), for requests as aztables
// v1.4.1 signs them: Shared Key Lite, x-ms-date, "/" + account + the
// escaped path, "?comp=" only.
var knownAnswers = []struct {
	name, method, target, contentType, auth string
	kind                                    Kind
	secondary                               bool
}{
	{"lite query tables", "GET", "/devstoreaccount1/Tables", "",
		"SharedKeyLite devstoreaccount1:sXFageAso+zT9fmHLfKvRcsH/7HPRXIxNcwRZkQsUZc=", KindSharedKeyLite, false},
	{"lite absolute-form target", "GET", "http://127.0.0.1:10002/devstoreaccount1/Tables?$top=5", "",
		"SharedKeyLite devstoreaccount1:sXFageAso+zT9fmHLfKvRcsH/7HPRXIxNcwRZkQsUZc=", KindSharedKeyLite, false},
	{"shared key insert", "POST", "/devstoreaccount1/mytable", "application/json",
		"SharedKey devstoreaccount1:wUnHGzjblthBlSWDJc1vgv83QFTnNS2vxf8X0P1/i6k=", KindSharedKey, false},
	{"comp only", "GET", "/devstoreaccount1/mytable?timeout=30&comp=acl", "",
		"SharedKeyLite devstoreaccount1:sj7wMx6skndHQf0MwtTguI7rZUnhj0IABV6imbfoph4=", KindSharedKeyLite, false},
	{"secondary", "GET", "/devstoreaccount1-secondary/?restype=service&comp=stats", "",
		"SharedKeyLite devstoreaccount1:542oLd0GuNgkzhftJv/iwps0YS5UBD6MhKf0HHvg1aE=", KindSharedKeyLite, true},
}

func serverRequest(method, target, contentType, auth string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.Header.Set("x-ms-date", testDate)
	r.Header.Set("x-ms-version", "2019-02-02")
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	return r
}

func accountOf(target string) string {
	p := target
	if i := strings.Index(p, "://"); i >= 0 {
		p = p[i+3:]
		p = p[strings.IndexByte(p, '/'):]
	}
	seg, _, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	seg, _, _ = strings.Cut(seg, "?")
	return seg
}

func devKey() []byte { return DevKeys()[DevAccount][0] }

func TestKnownAnswers(t *testing.T) {
	for _, c := range knownAnswers {
		t.Run(c.name, func(t *testing.T) {
			r := serverRequest(c.method, c.target, c.contentType, c.auth)
			p, err := Verify(r, accountOf(c.target), DevKeys(), testNow)
			if err != nil {
				t.Fatal(err)
			}
			if p.Kind != c.kind || p.Account != DevAccount || p.Secondary != c.secondary || p.Perms != PermAll {
				t.Fatalf("principal %+v", p)
			}
			// Our signer, on the client side, writes the same header.
			url := c.target
			if !strings.HasPrefix(url, "http") {
				url = "http://127.0.0.1:10002" + url
			}
			cr, _ := http.NewRequest(c.method, url, nil)
			cr.Header.Set("x-ms-date", testDate)
			if c.contentType != "" {
				cr.Header.Set("Content-Type", c.contentType)
			}
			if c.kind == KindSharedKey {
				SignSharedKey(cr, DevAccount, devKey())
			} else {
				SignSharedKeyLite(cr, DevAccount, devKey())
			}
			if got := cr.Header.Get("Authorization"); got != c.auth {
				t.Fatalf("signed %q, want %q", got, c.auth)
			}
		})
	}
}

func wantCode(t *testing.T, err error, code string) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v, want *Error %s", err, code)
	}
	if e.Code != code || e.Status != http.StatusForbidden {
		t.Fatalf("err = %#v, want %s 403", e, code)
	}
	return e
}

func TestTampered(t *testing.T) {
	key := devKey()
	signed := func(kind Kind) *http.Request {
		r := httptest.NewRequest("PUT", "/devstoreaccount1/mytable(PartitionKey='p',RowKey='r')?comp=x", nil)
		r.Header.Set("x-ms-date", testDate)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Content-MD5", "1B2M2Y8AsgTpgAmY7PhCfg==")
		signHeader(r, kind, DevAccount, key)
		if _, err := Verify(r, DevAccount, DevKeys(), testNow); err != nil {
			t.Fatalf("untampered %s: %v", kind, err)
		}
		return r
	}
	tamper := map[string]func(r *http.Request){
		"date":      func(r *http.Request) { r.Header.Set("x-ms-date", "Mon, 06 May 2024 07:08:10 GMT") },
		"path":      func(r *http.Request) { r.RequestURI = strings.Replace(r.RequestURI, "RowKey='r'", "RowKey='s'", 1) },
		"table":     func(r *http.Request) { r.RequestURI = strings.Replace(r.RequestURI, "mytable", "other", 1) },
		"comp":      func(r *http.Request) { r.URL.RawQuery = "comp=y" },
		"signature": func(r *http.Request) { r.Header.Set("Authorization", flipSig(r.Header.Get("Authorization"))) },
		"account": func(r *http.Request) {
			r.Header.Set("Authorization", strings.Replace(r.Header.Get("Authorization"), DevAccount, "devstoreaccount2", 1))
		},
		"scheme": func(r *http.Request) {
			r.Header.Set("Authorization", "Bearer "+strings.SplitN(r.Header.Get("Authorization"), " ", 2)[1])
		},
		"no date":      func(r *http.Request) { r.Header.Del("x-ms-date") },
		"short sig":    func(r *http.Request) { r.Header.Set("Authorization", "SharedKey devstoreaccount1:AAAA") },
		"method":       func(r *http.Request) { r.Method = "MERGE" },
		"content-type": func(r *http.Request) { r.Header.Set("Content-Type", "application/xml") },
		"content-md5":  func(r *http.Request) { r.Header.Set("Content-MD5", "") },
	}
	// Shared Key Lite signs neither the method nor the content headers.
	liteIgnores := map[string]bool{"method": true, "content-type": true, "content-md5": true}
	for _, kind := range []Kind{KindSharedKey, KindSharedKeyLite} {
		for name, f := range tamper {
			r := signed(kind)
			f(r)
			_, err := Verify(r, DevAccount, DevKeys(), testNow)
			if kind == KindSharedKeyLite && liteIgnores[name] {
				if err != nil {
					t.Errorf("%s, %s changed: %v", kind, name, err)
				}
				continue
			}
			wantCode(t, err, CodeAuthenticationFailed)
		}
	}
	// The Date header counts when there is no x-ms-date.
	r := httptest.NewRequest("GET", "/devstoreaccount1/Tables", nil)
	r.Header.Set("Date", testDate)
	SignSharedKey(r, DevAccount, key)
	if r.Header.Get("x-ms-date") != "" {
		t.Fatal("signer set x-ms-date beside Date")
	}
	if _, err := Verify(r, DevAccount, DevKeys(), testNow); err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Date", "Mon, 06 May 2024 07:08:11 GMT")
	wantCode(t, errOf(Verify(r, DevAccount, DevKeys(), testNow)), CodeAuthenticationFailed)
}

func errOf(_ Principal, err error) error { return err }

func flipSig(auth string) string {
	i := strings.LastIndexByte(auth, ':')
	sig, _ := base64.StdEncoding.DecodeString(auth[i+1:])
	sig[0] ^= 1
	return auth[:i+1] + base64.StdEncoding.EncodeToString(sig)
}

func TestClockSkew(t *testing.T) {
	for _, c := range []struct {
		offset time.Duration
		want   string // "" accepted
	}{
		{-14 * time.Minute, ""},
		{14 * time.Minute, ""},
		{-16 * time.Minute, "too old"},
		{16 * time.Minute, "too far in the future"},
	} {
		r := httptest.NewRequest("GET", "/devstoreaccount1/Tables", nil)
		r.Header.Set("x-ms-date", testNow.Add(c.offset).Format(http.TimeFormat))
		SignSharedKeyLite(r, DevAccount, devKey())
		_, err := Verify(r, DevAccount, DevKeys(), testNow)
		if c.want == "" {
			if err != nil {
				t.Errorf("offset %s: %v", c.offset, err)
			}
			continue
		}
		e := wantCode(t, err, CodeAuthenticationFailed)
		if !strings.Contains(e.Detail, c.want) || !strings.Contains(e.Detail, "clock skew") || !strings.Contains(e.Detail, "16m0s") {
			t.Errorf("offset %s: detail %q", c.offset, e.Detail)
		}
	}
}

func TestAccountsAndKeys(t *testing.T) {
	other := []byte("another key of thirty-two bytes!")
	keys := StaticKeys{DevAccount: {other, devKey()}, "acct2": {other}}
	r := serverRequest("GET", "/devstoreaccount1/Tables", "", knownAnswers[0].auth)
	// The second key (rotation) verifies.
	if _, err := Verify(r, DevAccount, keys, testNow); err != nil {
		t.Fatal(err)
	}
	// Another account's key does not.
	r = httptest.NewRequest("GET", "/acct2/Tables", nil)
	r.Header.Set("x-ms-date", testDate)
	SignSharedKeyLite(r, "acct2", devKey())
	wantCode(t, errOf(Verify(r, "acct2", keys, testNow)), CodeAuthenticationFailed)
	// A request signed for acct2 is not good for devstoreaccount1.
	SignSharedKeyLite(r, "acct2", other)
	if _, err := Verify(r, "acct2", keys, testNow); err != nil {
		t.Fatal(err)
	}
	wantCode(t, errOf(Verify(r, DevAccount, keys, testNow)), CodeAuthenticationFailed)
	// An unknown account, and no credentials at all.
	wantCode(t, errOf(Verify(r, "nobody", keys, testNow)), CodeAuthenticationFailed)
	r = httptest.NewRequest("GET", "/devstoreaccount1/Tables", nil)
	wantCode(t, errOf(Verify(r, DevAccount, keys, testNow)), CodeAuthorizationFailure)
}

// A secondary request may be signed over the path with or without the
// suffix.
func TestSecondaryWithoutSuffix(t *testing.T) {
	r := httptest.NewRequest("GET", "/devstoreaccount1/mytable()", nil)
	r.Header.Set("x-ms-date", testDate)
	SignSharedKey(r, DevAccount, devKey())
	auth := r.Header.Get("Authorization")
	r = httptest.NewRequest("GET", "/devstoreaccount1-secondary/mytable()", nil)
	r.Header.Set("x-ms-date", testDate)
	r.Header.Set("Authorization", auth)
	p, err := Verify(r, "devstoreaccount1-secondary", DevKeys(), testNow)
	if err != nil || !p.Secondary || p.Account != DevAccount {
		t.Fatalf("%+v %v", p, err)
	}
}

func TestErrorXML(t *testing.T) {
	e := authFailed("Signature did not match. String to sign used was a<b&c")
	want := `<?xml version="1.0" encoding="utf-8"?><Error><Code>AuthenticationFailed</Code><Message>` + msgAuthenticationFailed +
		`</Message><AuthenticationErrorDetail>Signature did not match. String to sign used was a&lt;b&amp;c</AuthenticationErrorDetail></Error>`
	if got := string(e.XML()); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if got := string(errPermission().XML()); !strings.Contains(got, "<Code>AuthorizationPermissionMismatch</Code>") || strings.Contains(got, "Detail") {
		t.Fatal(got)
	}
}

// Over a real connection: what the client signs is the path the server
// receives, escapes and quotes included.
func TestOverHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		acct, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if _, err := Verify(r, acct, DevKeys(), time.Now()); err != nil {
			w.WriteHeader(err.(*Error).Status)
			w.Write(err.(*Error).XML())
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	for _, path := range []string{
		"/devstoreaccount1/Tables",
		"/devstoreaccount1/my%20table(PartitionKey='a%20b',RowKey='c''d%2Fe')",
		"/devstoreaccount1/t(PartitionKey='%C3%BC',RowKey='x')?$filter=PartitionKey%20eq%20'a'&comp=acl",
		"/devstoreaccount1-secondary/?restype=service&comp=stats",
	} {
		for _, lite := range []bool{false, true} {
			r, err := http.NewRequest("GET", srv.URL+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if lite {
				SignSharedKeyLite(r, DevAccount, devKey())
			} else {
				SignSharedKey(r, DevAccount, devKey())
			}
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				t.Errorf("%s (lite %t): status %d", path, lite, resp.StatusCode)
			}
		}
	}
}
