package sharedkey

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// The well-known development account of the Azure storage emulators:
// UseDevelopmentStorage=true connection strings use it.
const (
	DevAccount = "devstoreaccount1"
	DevKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// MaxClockSkew is how far a request's date may be from the server's
// clock, either way.
const MaxClockSkew = 15 * time.Minute

// secondarySuffix marks the read-only secondary endpoint of an account.
const secondarySuffix = "-secondary"

// Keys finds an account's keys (decoded from base64): up to two, so a
// key can be rotated. The gateway backs it with the tenants' keys.
// Implementations must be safe for concurrent use.
type Keys interface {
	Lookup(account string) (keys [][]byte, ok bool)
}

// StaticKeys is a fixed Keys: account name to keys. Safe for concurrent
// use if not modified.
type StaticKeys map[string][][]byte

// Lookup implements Keys.
func (s StaticKeys) Lookup(account string) ([][]byte, bool) {
	k, ok := s[account]
	return k, ok
}

// DevKeys is the development account with its well-known key.
func DevKeys() StaticKeys {
	k, err := base64.StdEncoding.DecodeString(DevKey)
	if err != nil {
		panic("sharedkey: DevKey is not base64: " + err.Error())
	}
	return StaticKeys{DevAccount: {k}}
}

// Verify authenticates r as a request to account (the first path
// segment under path-style addressing; "x-secondary" addresses account
// x's secondary). It accepts Shared Key, Shared Key Lite, a service SAS
// and an account SAS (see the package comment); now is the server's
// clock. It returns the principal, or an *Error with the service's code
// (AuthenticationFailed for a bad or stale credential).
func Verify(r *http.Request, account string, keys Keys, now time.Time) (Principal, error) {
	name, secondary := strings.CutSuffix(account, secondarySuffix)
	auth := r.Header.Get("Authorization")
	q := r.URL.Query()
	if auth == "" && !q.Has("sig") {
		// Tables allow no anonymous access; Azurite answers this way.
		return Principal{}, errFailure()
	}
	ks, ok := keys.Lookup(name)
	if !ok || len(ks) == 0 {
		return Principal{}, authFailed("The account %q does not exist.", name)
	}
	var p Principal
	var err error
	if auth != "" {
		p, err = verifyHeader(r, auth, name, ks, now)
	} else {
		p, err = verifySAS(r, q, name, ks, keys, now)
	}
	if err != nil {
		return Principal{}, err
	}
	p.Account, p.Secondary = name, secondary
	return p, nil
}

func verifyHeader(r *http.Request, auth, account string, keys [][]byte, now time.Time) (Principal, error) {
	scheme, cred, _ := strings.Cut(auth, " ")
	var kind Kind
	switch scheme {
	case "SharedKey":
		kind = KindSharedKey
	case "SharedKeyLite":
		kind = KindSharedKeyLite
	default:
		return Principal{}, authFailed("Authorization scheme %q is not supported; use SharedKey, SharedKeyLite or a SAS.", scheme)
	}
	signer, sig64, ok := strings.Cut(strings.TrimSpace(cred), ":")
	if !ok || signer == "" {
		return Principal{}, authFailed("The Authorization header is not of the form '%s account:signature'.", scheme)
	}
	if signer != account {
		return Principal{}, authFailed("The account in the Authorization header, %q, is not the account addressed, %q.", signer, account)
	}
	sig, err := base64.StdEncoding.DecodeString(sig64)
	if err != nil || len(sig) != sha256.Size {
		return Principal{}, authFailed("The signature in the Authorization header is not a base64 HMAC-SHA256.")
	}
	date := requestDate(r)
	if date == "" {
		return Principal{}, authFailed("Request date header not specified.")
	}
	var sts string
	matched := false
	for _, cr := range canonicalResources(r, account) {
		s := stringToSign(kind, r, date, cr)
		if sts == "" {
			sts = s
		}
		for _, k := range keys {
			if hmac.Equal(mac(k, s), sig) {
				matched = true
			}
		}
	}
	if !matched {
		return Principal{}, authFailed("The MAC signature found in the HTTP request '%s' is not the same as any computed signature. Server used following string to sign: '%s'.", sig64, sts)
	}
	t, err := http.ParseTime(date)
	if err != nil {
		return Principal{}, authFailed("The request date header '%s' is not a valid HTTP date.", date)
	}
	switch skew := now.Sub(t); {
	case skew > MaxClockSkew:
		return Principal{}, authFailed("Request date header too old: '%s'. The server's time is '%s': %s of clock skew, more than the %s allowed.",
			date, now.UTC().Format(http.TimeFormat), skew.Round(time.Second), MaxClockSkew)
	case -skew > MaxClockSkew:
		return Principal{}, authFailed("Request date header too far in the future: '%s'. The server's time is '%s': %s of clock skew, more than the %s allowed.",
			date, now.UTC().Format(http.TimeFormat), (-skew).Round(time.Second), MaxClockSkew)
	}
	return Principal{Kind: kind, Perms: PermAll, ResourceTypes: ResAll}, nil
}

// requestDate is the date the signature covers: x-ms-date if present,
// else Date.
func requestDate(r *http.Request) string {
	if d := r.Header.Get("x-ms-date"); d != "" {
		return d
	}
	return r.Header.Get("Date")
}

func stringToSign(kind Kind, r *http.Request, date, canonicalResource string) string {
	if kind == KindSharedKeyLite {
		return date + "\n" + canonicalResource
	}
	return r.Method + "\n" + r.Header.Get("Content-MD5") + "\n" + r.Header.Get("Content-Type") + "\n" + date + "\n" + canonicalResource
}

// canonicalResources are the CanonicalizedResource strings a signature
// over r may use: the path as sent, and for an "x-secondary" first
// segment, the path with the suffix removed too.
func canonicalResources(r *http.Request, account string) []string {
	path := requestPath(r)
	comp := ""
	if v, ok := r.URL.Query()["comp"]; ok {
		comp = "?comp=" + v[0]
	}
	out := []string{"/" + account + path + comp}
	seg, rest, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if base, ok := strings.CutSuffix(seg, secondarySuffix); ok {
		alt := "/" + base
		if strings.Contains(strings.TrimPrefix(path, "/"), "/") {
			alt += "/" + rest
		}
		out = append(out, "/"+account+alt+comp)
	}
	return out
}

// requestPath is r's path as it went over the wire (escaped), "/" if
// empty. On a server that is RequestURI's path; on a client, the one
// URL.RequestURI will send.
func requestPath(r *http.Request) string {
	if u := r.RequestURI; u != "" && u != "*" {
		if i := strings.IndexByte(u, '?'); i >= 0 {
			u = u[:i]
		}
		if strings.HasPrefix(u, "/") {
			return u
		}
		if pu, err := url.Parse(r.RequestURI); err == nil && pu.EscapedPath() != "" {
			return pu.EscapedPath() // absolute-form, as proxies send
		}
	}
	if p := r.URL.EscapedPath(); p != "" {
		return p
	}
	return "/"
}

func mac(key []byte, s string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(s))
	return h.Sum(nil)
}

func sign(key []byte, s string) string {
	return base64.StdEncoding.EncodeToString(mac(key, s))
}

// SignSharedKey signs r with Shared Key (Table form) for account, whose
// key is key (decoded). It sets x-ms-date to the current time if r has
// neither x-ms-date nor Date, then the Authorization header. Sign last:
// the signature covers the method, Content-MD5, Content-Type, date and
// path.
func SignSharedKey(r *http.Request, account string, key []byte) {
	signHeader(r, KindSharedKey, account, key)
}

// SignSharedKeyLite signs r with Shared Key Lite (Table form), as
// aztables does. See SignSharedKey.
func SignSharedKeyLite(r *http.Request, account string, key []byte) {
	signHeader(r, KindSharedKeyLite, account, key)
}

func signHeader(r *http.Request, kind Kind, account string, key []byte) {
	if requestDate(r) == "" {
		r.Header.Set("x-ms-date", time.Now().UTC().Format(http.TimeFormat))
	}
	cr := canonicalResources(r, account)[0]
	r.Header.Set("Authorization", kind.String()+" "+account+":"+sign(key, stringToSign(kind, r, requestDate(r), cr)))
}
