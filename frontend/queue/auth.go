package queue

// Authentication as the Queue service does it. The Table service's
// signing strings differ (frontend/sharedkey); the Principal, Kind, Perm
// and Error vocabulary is shared.
//
//   - Shared Key: VERB\nContent-Encoding\nContent-Language\n
//     Content-Length ("" for 0)\nContent-MD5\nContent-Type\nDate\n
//     If-Modified-Since\nIf-Match\nIf-None-Match\nIf-Unmodified-Since\n
//     Range\n + CanonicalizedHeaders + CanonicalizedResource, where
//     CanonicalizedHeaders are the x-ms-* headers, "name:value\n",
//     lower-case names in order, and CanonicalizedResource is
//     "/account" + the path as sent + "\nname:v1,v2" for every query
//     parameter (lower-case names in order, values decoded and sorted).
//   - Shared Key Lite: VERB\nContent-MD5\nContent-Type\nDate\n +
//     CanonicalizedHeaders + "/account" + path [+ "?comp=" value].
//   - A service SAS for one queue (sv, sp from "raup", st, se, sip, spr,
//     si naming a stored access policy of the queue, sig), signed over
//     sp\nst\nse\n/queue/account/queue\nsi\nsip\nspr\nsv.
//   - An account SAS (ss containing q, srt from "sco", sp from
//     "racwdlup"), signed over account\nsp\nss\nsrt\nst\nse\nsip\nspr\nsv\n
//     (and ses\n from sv 2020-12-06 on).

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tabuladb/tabula/frontend/sharedkey"
)

const (
	secondarySuffix      = "-secondary"
	minSASVersion        = "2015-04-05"
	encryptionScopeSince = "2020-12-06"
)

// policyLookup finds a queue's stored access policy id (si).
type policyLookup func(queue, id string) (accessPolicy, bool, error)

const msgAuthFailed = "Server failed to authenticate the request. Make sure the value of the Authorization header is formed correctly including the signature."

func authFailed(format string, args ...any) *svcError {
	return &svcError{status: http.StatusForbidden, code: sharedkey.CodeAuthenticationFailed, msg: msgAuthFailed, detail: fmt.Sprintf(format, args...)}
}

func denied(code, msg string) *svcError { return newErr(http.StatusForbidden, code, msg) }

func errAuthorization() *svcError {
	return denied(sharedkey.CodeAuthorizationFailure, "This request is not authorized to perform this operation.")
}

func errPermission() *svcError {
	return denied(sharedkey.CodeAuthorizationPermissionMismatch, "This request is not authorized to perform this operation using this permission.")
}

func errResourceType() *svcError {
	return denied(sharedkey.CodeAuthorizationResourceTypeMismatch, "This request is not authorized to perform this operation using this resource type.")
}

// verify authenticates r, addressed to path account acct ("x-secondary"
// for x's secondary) and queue (the path's queue, "" for the service).
func verify(r *http.Request, acct, queue string, keys sharedkey.Keys, policies policyLookup, now time.Time) (sharedkey.Principal, error) {
	name, secondary := strings.CutSuffix(acct, secondarySuffix)
	auth := r.Header.Get("Authorization")
	q := r.URL.Query()
	if auth == "" && !q.Has("sig") {
		return sharedkey.Principal{}, authFailed("The request carries no credential: anonymous access is not allowed to queues.")
	}
	ks, ok := keys.Lookup(name)
	if !ok || len(ks) == 0 {
		return sharedkey.Principal{}, authFailed("The account %q does not exist.", name)
	}
	var p sharedkey.Principal
	var err error
	if auth != "" {
		p, err = verifyHeader(r, auth, name, ks, now)
	} else {
		p, err = verifySAS(r, q, name, queue, ks, policies, now)
	}
	if err != nil {
		return sharedkey.Principal{}, err
	}
	p.Account, p.Secondary = name, secondary
	return p, nil
}

func verifyHeader(r *http.Request, auth, account string, keys [][]byte, now time.Time) (sharedkey.Principal, error) {
	scheme, cred, _ := strings.Cut(auth, " ")
	var kind sharedkey.Kind
	switch scheme {
	case "SharedKey":
		kind = sharedkey.KindSharedKey
	case "SharedKeyLite":
		kind = sharedkey.KindSharedKeyLite
	default:
		return sharedkey.Principal{}, authFailed("Authorization scheme %q is not supported; use SharedKey, SharedKeyLite or a SAS.", scheme)
	}
	signer, sig64, ok := strings.Cut(strings.TrimSpace(cred), ":")
	if !ok || signer == "" {
		return sharedkey.Principal{}, authFailed("The Authorization header is not of the form '%s account:signature'.", scheme)
	}
	if signer != account {
		return sharedkey.Principal{}, authFailed("The account in the Authorization header, %q, is not the account addressed, %q.", signer, account)
	}
	sig, err := base64.StdEncoding.DecodeString(sig64)
	if err != nil || len(sig) != sha256.Size {
		return sharedkey.Principal{}, authFailed("The signature in the Authorization header is not a base64 HMAC-SHA256.")
	}
	date := r.Header.Get("x-ms-date")
	if date == "" {
		date = r.Header.Get("Date")
	}
	if date == "" {
		return sharedkey.Principal{}, authFailed("Request date header not specified.")
	}
	var sts string
	matched := false
	for _, path := range signedPaths(r) {
		s := stringToSign(kind, r, account, path)
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
		return sharedkey.Principal{}, authFailed("The MAC signature found in the HTTP request '%s' is not the same as any computed signature. Server used following string to sign: '%s'.", sig64, sts)
	}
	t, err := http.ParseTime(date)
	if err != nil {
		return sharedkey.Principal{}, authFailed("The request date header '%s' is not a valid HTTP date.", date)
	}
	if skew := now.Sub(t); skew > sharedkey.MaxClockSkew || -skew > sharedkey.MaxClockSkew {
		return sharedkey.Principal{}, authFailed("Request date header '%s' is more than %s from the server's time '%s'.",
			date, sharedkey.MaxClockSkew, now.UTC().Format(http.TimeFormat))
	}
	return sharedkey.Principal{Kind: kind, Perms: sharedkey.PermAll, ResourceTypes: sharedkey.ResAll}, nil
}

// signedPaths are the paths a signature over r may cover: as sent, and
// for an "x-secondary" first segment, without the suffix.
func signedPaths(r *http.Request) []string {
	path := r.URL.EscapedPath()
	if u := r.RequestURI; u != "" && strings.HasPrefix(u, "/") {
		path, _, _ = strings.Cut(u, "?")
	}
	if path == "" {
		path = "/"
	}
	out := []string{path}
	seg, rest, slash := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if base, ok := strings.CutSuffix(seg, secondarySuffix); ok {
		alt := "/" + base
		if slash {
			alt += "/" + rest
		}
		out = append(out, alt)
	}
	return out
}

func stringToSign(kind sharedkey.Kind, r *http.Request, account, path string) string {
	h := r.Header.Get
	var b strings.Builder
	if kind == sharedkey.KindSharedKeyLite {
		b.WriteString(r.Method + "\n" + h("Content-MD5") + "\n" + h("Content-Type") + "\n" + h("Date") + "\n")
	} else {
		length := ""
		if r.ContentLength > 0 {
			length = strconv.FormatInt(r.ContentLength, 10)
		} else if v := h("Content-Length"); v != "" && v != "0" {
			length = v // a client-side request
		}
		for _, v := range []string{r.Method, h("Content-Encoding"), h("Content-Language"), length, h("Content-MD5"), h("Content-Type"),
			h("Date"), h("If-Modified-Since"), h("If-Match"), h("If-None-Match"), h("If-Unmodified-Since"), h("Range")} {
			b.WriteString(v + "\n")
		}
	}
	var names []string
	for n := range r.Header {
		if l := strings.ToLower(n); strings.HasPrefix(l, "x-ms-") {
			names = append(names, l)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		b.WriteString(n + ":" + strings.TrimSpace(strings.Join(r.Header.Values(n), ",")) + "\n")
	}
	b.WriteString("/" + account + path)
	q := r.URL.Query()
	if kind == sharedkey.KindSharedKeyLite {
		if v, ok := q["comp"]; ok {
			b.WriteString("?comp=" + v[0])
		}
		return b.String()
	}
	byName := map[string][]string{}
	for n, vs := range q {
		l := strings.ToLower(n)
		byName[l] = append(byName[l], vs...)
	}
	qnames := make([]string, 0, len(byName))
	for n := range byName {
		qnames = append(qnames, n)
	}
	slices.Sort(qnames)
	for _, n := range qnames {
		vs := byName[n]
		slices.Sort(vs)
		b.WriteString("\n" + n + ":" + strings.Join(vs, ","))
	}
	return b.String()
}

func mac(key []byte, s string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(s))
	return m.Sum(nil)
}

// SignSharedKey signs r (a client's request) with Shared Key, queue
// form, for account with key (decoded); it sets x-ms-date when r has no
// date. Sign last.
func SignSharedKey(r *http.Request, account string, key []byte) {
	signHeader(r, sharedkey.KindSharedKey, account, key)
}

// SignSharedKeyLite signs r with Shared Key Lite, queue form.
func SignSharedKeyLite(r *http.Request, account string, key []byte) {
	signHeader(r, sharedkey.KindSharedKeyLite, account, key)
}

func signHeader(r *http.Request, kind sharedkey.Kind, account string, key []byte) {
	if r.Header.Get("x-ms-date") == "" && r.Header.Get("Date") == "" {
		r.Header.Set("x-ms-date", time.Now().UTC().Format(http.TimeFormat))
	}
	path := r.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	if r.ContentLength > 0 {
		r.Header.Set("Content-Length", strconv.FormatInt(r.ContentLength, 10))
		defer r.Header.Del("Content-Length")
	}
	sig := base64.StdEncoding.EncodeToString(mac(key, stringToSign(kind, r, account, path)))
	r.Header.Set("Authorization", kind.String()+" "+account+":"+sig)
}

// sasParams is a queue or account SAS, checked for form.
type sasParams struct {
	raw          map[string]string
	account      bool
	sig          []byte
	perms        sharedkey.Perm
	rtypes       sharedkey.ResourceType
	start, end   time.Time
	ipLo, ipHi   netip.Addr
	haveIP       bool
	startSet     bool
	expirySetSAS bool
}

var sasNames = []string{"sv", "ss", "srt", "sp", "st", "se", "sip", "spr", "si", "ses", "sig"}

// parseSAS reads the SAS in q. It says nothing of the signature.
func parseSAS(q url.Values) (*sasParams, error) {
	p := &sasParams{raw: map[string]string{}}
	for _, n := range sasNames {
		switch v := q[n]; len(v) {
		case 0:
		case 1:
			p.raw[n] = v[0]
		default:
			return nil, fmt.Errorf("SAS parameter %s is given %d times", n, len(v))
		}
	}
	g := func(n string) string { return p.raw[n] }
	sig, err := base64.StdEncoding.DecodeString(g("sig"))
	if err != nil || len(sig) != sha256.Size {
		return nil, errors.New("sig is not a base64 HMAC-SHA256")
	}
	p.sig = sig
	if _, err := time.Parse("2006-01-02", g("sv")); err != nil {
		return nil, fmt.Errorf("sv %q is not a version (YYYY-MM-DD)", g("sv"))
	}
	if g("sv") < minSASVersion {
		return nil, fmt.Errorf("sv %s is not supported; use %s or later", g("sv"), minSASVersion)
	}
	p.account = g("ss") != "" || g("srt") != ""
	allowed := "raup"
	if p.account {
		if g("ss") == "" || g("srt") == "" || g("sp") == "" {
			return nil, errors.New("an account SAS needs ss, srt and sp")
		}
		for _, c := range g("ss") {
			if !strings.ContainsRune("bfqt", c) {
				return nil, fmt.Errorf("ss %q: unknown service %q", g("ss"), c)
			}
		}
		for _, c := range g("srt") {
			i := strings.IndexRune("sco", c)
			if i < 0 {
				return nil, fmt.Errorf("srt %q: unknown resource type %q", g("srt"), c)
			}
			p.rtypes |= 1 << i
		}
		if g("si") != "" {
			return nil, errors.New("si is not a parameter of an account SAS")
		}
		allowed = "racwdlupxytfi"
	}
	seen := map[rune]bool{}
	for _, c := range g("sp") {
		if seen[c] || !strings.ContainsRune(allowed, c) {
			return nil, fmt.Errorf("sp %q: unknown or repeated permission %q", g("sp"), c)
		}
		seen[c] = true
		if i := strings.IndexRune("racwdlup", c); i >= 0 {
			p.perms |= 1 << i
		}
	}
	if s := g("st"); s != "" {
		if p.start, err = sharedkey.ParseSASTime(s); err != nil {
			return nil, fmt.Errorf("st: %w", err)
		}
	}
	if s := g("se"); s != "" {
		if p.end, err = sharedkey.ParseSASTime(s); err != nil {
			return nil, fmt.Errorf("se: %w", err)
		}
	}
	if g("si") == "" && (g("sp") == "" || g("se") == "") {
		return nil, errors.New("a SAS without a stored access policy (si) needs sp and se")
	}
	if s := g("sip"); s != "" {
		if p.ipLo, p.ipHi, err = sharedkey.ParseIPRange(s); err != nil {
			return nil, err
		}
		p.haveIP = true
	}
	switch g("spr") {
	case "", "https", "https,http", "http,https":
	default:
		return nil, fmt.Errorf("spr %q: want https or https,http", g("spr"))
	}
	return p, nil
}

func (p *sasParams) stringToSign(account, queue string) string {
	g := func(n string) string { return p.raw[n] }
	if p.account {
		fields := []string{account, g("sp"), g("ss"), g("srt"), g("st"), g("se"), g("sip"), g("spr"), g("sv")}
		if g("sv") >= encryptionScopeSince {
			fields = append(fields, g("ses"))
		}
		return strings.Join(fields, "\n") + "\n"
	}
	return strings.Join([]string{g("sp"), g("st"), g("se"), "/queue/" + account + "/" + queue, g("si"), g("sip"), g("spr"), g("sv")}, "\n")
}

func verifySAS(r *http.Request, q url.Values, account, queue string, keys [][]byte, policies policyLookup, now time.Time) (sharedkey.Principal, error) {
	p, err := parseSAS(q)
	if err != nil {
		return sharedkey.Principal{}, authFailed("%v", err)
	}
	sts := p.stringToSign(account, queue)
	matched := false
	for _, k := range keys {
		if hmac.Equal(mac(k, sts), p.sig) {
			matched = true
		}
	}
	if !matched {
		return sharedkey.Principal{}, authFailed("Signature did not match. String to sign used was %s", sts)
	}
	pr := sharedkey.Principal{Version: p.raw["sv"], Perms: p.perms, Start: p.start, Expiry: p.end}
	if p.account {
		if !strings.Contains(p.raw["ss"], "q") {
			return sharedkey.Principal{}, denied(sharedkey.CodeAuthorizationServiceMismatch, "This request is not authorized to perform this operation using this service.")
		}
		pr.Kind, pr.ResourceTypes = sharedkey.KindAccountSAS, p.rtypes
	} else {
		pr.Kind, pr.Table = sharedkey.KindServiceSAS, queue
		if id := p.raw["si"]; id != "" {
			pol, ok, err := policies(queue, id)
			if err != nil {
				return sharedkey.Principal{}, err
			}
			if !ok {
				return sharedkey.Principal{}, authFailed("The stored access policy %q of queue %q does not exist.", id, queue)
			}
			if err := applyPolicy(&pr, p, pol); err != nil {
				return sharedkey.Principal{}, err
			}
		}
	}
	if pr.Expiry.IsZero() {
		return sharedkey.Principal{}, authFailed("Signed expiry time must be specified, in the SAS or its stored access policy.")
	}
	if now.Before(pr.Start) || now.After(pr.Expiry) {
		return sharedkey.Principal{}, authFailed("Signature not valid in the specified time frame: Start [%s] - Expiry [%s] - Current [%s]",
			pr.Start.Format(http.TimeFormat), pr.Expiry.Format(http.TimeFormat), now.UTC().Format(http.TimeFormat))
	}
	if p.raw["spr"] == "https" && r.TLS == nil {
		return sharedkey.Principal{}, denied(sharedkey.CodeAuthorizationProtocolMismatch, "This request is not authorized to perform this operation using this protocol.")
	}
	if p.haveIP {
		ip := clientIP(r)
		if !ip.IsValid() || ip.Less(p.ipLo) || p.ipHi.Less(ip) {
			return sharedkey.Principal{}, denied(sharedkey.CodeAuthorizationSourceIPMismatch, fmt.Sprintf("This request is not authorized to perform this operation using this source IP %s.", ip))
		}
	}
	return pr, nil
}

// applyPolicy fills what a service SAS leaves to its stored access
// policy; a field may be set in one place only.
func applyPolicy(pr *sharedkey.Principal, p *sasParams, pol accessPolicy) error {
	both := func(n, v string) bool { return p.raw[n] != "" && v != "" }
	if both("sp", pol.Permission) || both("st", pol.Start) || both("se", pol.Expiry) {
		return authFailed("A field is set both in the SAS and in its stored access policy %q.", pol.ID)
	}
	if pol.Permission != "" {
		pr.Perms = 0
		for _, c := range pol.Permission {
			if i := strings.IndexRune("racwdlup", c); i >= 0 && strings.ContainsRune("raup", c) {
				pr.Perms |= 1 << i
			}
		}
	}
	for _, f := range []struct {
		s   string
		dst *time.Time
	}{{pol.Start, &pr.Start}, {pol.Expiry, &pr.Expiry}} {
		if f.s == "" {
			continue
		}
		t, err := sharedkey.ParseSASTime(f.s)
		if err != nil {
			return authFailed("stored access policy %q: %v", pol.ID, err)
		}
		*f.dst = t
	}
	return nil
}

func clientIP(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return ip.Unmap()
}

// op is an operation of the Queue service, as far as authorization
// cares.
type op uint8

const (
	opListQueues op = iota + 1
	opGetServiceProperties
	opSetServiceProperties
	opGetServiceStats
	opCreateQueue
	opDeleteQueue
	opGetQueueMetadata
	opSetQueueMetadata
	opGetQueueACL
	opSetQueueACL
	opPutMessage
	opGetMessages
	opPeekMessages
	opDeleteMessage
	opClearMessages
	opUpdateMessage
)

// need is what an op needs of a SAS: an account SAS's resource type and
// permission (any of), and a service SAS's permission (0: not allowed).
type need struct {
	res     sharedkey.ResourceType
	account sharedkey.Perm
	service sharedkey.Perm
}

// From Azurite's OperationAccountSASPermission and
// OperationQueueSASPermission, as the service documents them.
var needs = map[op]need{
	opListQueues:           {res: sharedkey.ResService, account: sharedkey.PermList},
	opGetServiceProperties: {res: sharedkey.ResService, account: sharedkey.PermRead},
	opSetServiceProperties: {res: sharedkey.ResService, account: sharedkey.PermWrite},
	opGetServiceStats:      {res: sharedkey.ResService, account: sharedkey.PermRead},
	opCreateQueue:          {res: sharedkey.ResContainer, account: sharedkey.PermCreate | sharedkey.PermWrite},
	opDeleteQueue:          {res: sharedkey.ResContainer, account: sharedkey.PermDelete},
	opGetQueueMetadata:     {res: sharedkey.ResContainer, account: sharedkey.PermRead, service: sharedkey.PermRead},
	opSetQueueMetadata:     {res: sharedkey.ResContainer, account: sharedkey.PermWrite},
	opGetQueueACL:          {res: sharedkey.ResContainer},
	opSetQueueACL:          {res: sharedkey.ResContainer},
	opPutMessage:           {res: sharedkey.ResObject, account: sharedkey.PermAdd, service: sharedkey.PermAdd},
	opGetMessages:          {res: sharedkey.ResObject, account: sharedkey.PermProcess, service: sharedkey.PermProcess},
	opPeekMessages:         {res: sharedkey.ResObject, account: sharedkey.PermRead, service: sharedkey.PermRead},
	opDeleteMessage:        {res: sharedkey.ResContainer | sharedkey.ResObject, account: sharedkey.PermProcess, service: sharedkey.PermProcess},
	opClearMessages:        {res: sharedkey.ResContainer | sharedkey.ResObject, account: sharedkey.PermDelete, service: sharedkey.PermProcess},
	opUpdateMessage:        {res: sharedkey.ResContainer | sharedkey.ResObject, account: sharedkey.PermUpdate, service: sharedkey.PermUpdate},
}

// allows says whether p may perform o on queue.
func allows(p sharedkey.Principal, o op, queue string) error {
	n := needs[o]
	switch p.Kind {
	case sharedkey.KindSharedKey, sharedkey.KindSharedKeyLite:
		return nil
	case sharedkey.KindAccountSAS:
		if p.ResourceTypes&n.res == 0 {
			return errResourceType()
		}
		if p.Perms&n.account == 0 {
			return errPermission()
		}
		return nil
	case sharedkey.KindServiceSAS:
		if p.Table != queue {
			return errAuthorization()
		}
		if n.service == 0 {
			return errAuthorization()
		}
		if p.Perms&n.service == 0 {
			return errPermission()
		}
		return nil
	}
	return errAuthorization()
}

// ServiceSAS makes a service SAS (sv 2019-12-12) for one queue, signed
// with key: permissions from "raup", expiry in ISO 8601 UTC, and id a
// stored access policy of the queue ("" for none; the policy supplies
// what is left empty).
func ServiceSAS(account string, key []byte, queue, perms, expiry, id string) url.Values {
	v := url.Values{"sv": {DefaultVersion}}
	p := &sasParams{raw: map[string]string{"sv": DefaultVersion, "sp": perms, "se": expiry, "si": id}}
	for n, s := range p.raw {
		if s != "" {
			v.Set(n, s)
		}
	}
	v.Set("sig", base64.StdEncoding.EncodeToString(mac(key, p.stringToSign(account, queue))))
	return v
}

// AccountSAS makes an account SAS (sv 2019-12-12) signed with key:
// services (ss), resource types (srt), permissions (sp), expiry (se).
func AccountSAS(account string, key []byte, services, resourceTypes, perms, expiry string) url.Values {
	p := &sasParams{account: true, raw: map[string]string{"sv": DefaultVersion, "ss": services, "srt": resourceTypes, "sp": perms, "se": expiry}}
	v := url.Values{}
	for n, s := range p.raw {
		v.Set(n, s)
	}
	v.Set("sig", base64.StdEncoding.EncodeToString(mac(key, p.stringToSign(account, ""))))
	return v
}
