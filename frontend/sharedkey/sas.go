package sharedkey

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
	"strings"
	"time"
)

// SASVersion is the sv our signers write by default: what aztables
// v1.4.1 and the other current table SDKs send.
const SASVersion = "2019-02-02"

// Versions that change the SAS formats.
const (
	minSASVersion        = "2015-04-05" // sip, spr, /table/ resources; account SAS
	encryptionScopeSince = "2020-12-06" // account SAS signs ses
)

// Policies finds stored access policies (a table's ACL). If the Keys
// given to Verify also implement Policies, a service SAS may name one
// with si; otherwise such a SAS is refused with ErrStoredPolicy.
type Policies interface {
	Policy(account, table, id string) (Policy, bool)
}

// Policy is a stored access policy: the fields a SAS naming it may
// leave out. Zero fields are unset.
type Policy struct {
	Start, Expiry time.Time
	Permissions   string // letters from "raud"
}

// sasParams is a SAS's query parameters, checked for form.
type sasParams struct {
	raw     map[string]string // decoded values by name
	account bool              // an account SAS (ss/srt), else a service SAS
	sig     []byte
	perms   Perm
	rtypes  ResourceType
	start   time.Time
	expiry  time.Time
	ipLo    netip.Addr // valid when sip is set
	ipHi    netip.Addr
}

var sasNames = []string{"sv", "ss", "srt", "sp", "st", "se", "sip", "spr", "si", "tn", "spk", "srk", "epk", "erk", "ses", "sig"}

// parseSAS reads and checks the form of a SAS in query q. It says
// nothing of the signature's validity.
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
	get := func(n string) string { return p.raw[n] }
	sig, err := base64.StdEncoding.DecodeString(get("sig"))
	if err != nil || len(sig) != sha256.Size {
		return nil, errors.New("sig is not a base64 HMAC-SHA256")
	}
	p.sig = sig
	sv := get("sv")
	if !isDate(sv) {
		return nil, fmt.Errorf("sv %q is not a version (YYYY-MM-DD)", sv)
	}
	if sv < minSASVersion {
		return nil, fmt.Errorf("sv %s is not supported; use %s or later", sv, minSASVersion)
	}
	p.account = get("ss") != "" || get("srt") != ""
	if p.account {
		if get("ss") == "" || get("srt") == "" || get("sp") == "" {
			return nil, errors.New("an account SAS needs ss, srt and sp")
		}
		for _, c := range get("ss") {
			if !strings.ContainsRune("bfqt", c) {
				return nil, fmt.Errorf("ss %q: unknown service %q", get("ss"), c)
			}
		}
		for _, c := range get("srt") {
			i := strings.IndexRune("sco", c)
			if i < 0 {
				return nil, fmt.Errorf("srt %q: unknown resource type %q", get("srt"), c)
			}
			p.rtypes |= 1 << i
		}
		for _, n := range []string{"tn", "si", "spk", "srk", "epk", "erk"} {
			if get(n) != "" {
				return nil, fmt.Errorf("%s is not a parameter of an account SAS", n)
			}
		}
		if get("ses") != "" && sv < encryptionScopeSince {
			return nil, fmt.Errorf("ses needs sv %s or later", encryptionScopeSince)
		}
	} else {
		if get("tn") == "" {
			return nil, errors.New("a service SAS for tables needs tn")
		}
		if get("ses") != "" {
			return nil, errors.New("ses is not a parameter of a table SAS")
		}
		if get("srk") != "" && get("spk") == "" || get("erk") != "" && get("epk") == "" {
			return nil, errors.New("srk needs spk and erk needs epk")
		}
	}
	if p.perms, err = parsePerms(get("sp"), p.account); err != nil {
		return nil, err
	}
	if s := get("st"); s != "" {
		if p.start, err = ParseSASTime(s); err != nil {
			return nil, fmt.Errorf("st: %w", err)
		}
	}
	if s := get("se"); s != "" {
		if p.expiry, err = ParseSASTime(s); err != nil {
			return nil, fmt.Errorf("se: %w", err)
		}
	}
	if get("si") == "" && (get("sp") == "" || get("se") == "") {
		return nil, errors.New("a SAS without a stored access policy (si) needs sp and se")
	}
	if s := get("sip"); s != "" {
		if p.ipLo, p.ipHi, err = ParseIPRange(s); err != nil {
			return nil, err
		}
	}
	switch get("spr") {
	case "", "https", "https,http", "http,https":
	default:
		return nil, fmt.Errorf("spr %q: want https or https,http", get("spr"))
	}
	return p, nil
}

// parsePerms reads sp: letters from "raud" for a table SAS, from
// "racwdlup" for an account SAS, each at most once. An account SAS
// made for several services may carry blob and queue letters too
// ("xytfi"); they grant nothing here.
func parsePerms(sp string, account bool) (Perm, error) {
	allowed, ignored := "raud", ""
	if account {
		allowed, ignored = permLetters, "xytfi"
	}
	var p Perm
	seen := map[rune]bool{}
	for _, c := range sp {
		if seen[c] {
			return 0, fmt.Errorf("sp %q repeats %q", sp, c)
		}
		seen[c] = true
		switch {
		case strings.ContainsRune(allowed, c):
			p |= 1 << strings.IndexRune(permLetters, c)
		case strings.ContainsRune(ignored, c):
		default:
			return 0, fmt.Errorf("sp %q: unknown permission %q", sp, c)
		}
	}
	return p, nil
}

func isDate(s string) bool {
	_, err := time.Parse("2006-01-02", s)
	return err == nil
}

// sasTimeLayouts are the ISO 8601 UTC forms the service accepts in st
// and se.
var sasTimeLayouts = []string{
	"2006-01-02T15:04:05Z",
	"2006-01-02T15:04:05.9999999Z",
	"2006-01-02T15:04Z",
	"2006-01-02",
	time.RFC3339Nano,
}

// ParseIPRange parses a SAS's sip: one address, or "lo-hi" of one family
// with lo ≤ hi. The Queue service's SAS shares it.
func ParseIPRange(s string) (lo, hi netip.Addr, err error) {
	l, h, ok := strings.Cut(s, "-")
	if !ok {
		h = l
	}
	if lo, err = netip.ParseAddr(l); err != nil {
		return lo, hi, fmt.Errorf("sip %q: %w", s, err)
	}
	if hi, err = netip.ParseAddr(h); err != nil {
		return lo, hi, fmt.Errorf("sip %q: %w", s, err)
	}
	if lo.Is4() != hi.Is4() || hi.Less(lo) {
		return lo, hi, fmt.Errorf("sip %q is not a range", s)
	}
	return lo, hi, nil
}

// ParseSASTime parses a SAS's st or se (any of the ISO 8601 UTC forms the
// service accepts). The Queue service's SAS shares it.
func ParseSASTime(s string) (time.Time, error) {
	for _, l := range sasTimeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not an ISO 8601 UTC time", s)
}

func (p *sasParams) stringToSign(account string) string {
	g := func(n string) string { return p.raw[n] }
	if p.account {
		fields := []string{account, g("sp"), g("ss"), g("srt"), g("st"), g("se"), g("sip"), g("spr"), g("sv")}
		if g("sv") >= encryptionScopeSince {
			fields = append(fields, g("ses"))
		}
		return strings.Join(fields, "\n") + "\n"
	}
	resource := "/table/" + account + "/" + strings.ToLower(g("tn"))
	return strings.Join([]string{g("sp"), g("st"), g("se"), resource, g("si"), g("sip"), g("spr"), g("sv"),
		g("spk"), g("srk"), g("epk"), g("erk")}, "\n")
}

func verifySAS(r *http.Request, q url.Values, account string, keys [][]byte, all Keys, now time.Time) (Principal, error) {
	p, err := parseSAS(q)
	if err != nil {
		return Principal{}, authFailed("%v", err)
	}
	sts := p.stringToSign(account)
	matched := false
	for _, k := range keys {
		if hmac.Equal(mac(k, sts), p.sig) {
			matched = true
		}
	}
	if !matched {
		return Principal{}, authFailed("Signature did not match. String to sign used was %s", sts)
	}
	pr := Principal{Version: p.raw["sv"], Perms: p.perms, Start: p.start, Expiry: p.expiry}
	if p.account {
		if !strings.Contains(p.raw["ss"], "t") {
			return Principal{}, denied(CodeAuthorizationServiceMismatch, "This request is not authorized to perform this operation using this service.")
		}
		pr.Kind, pr.ResourceTypes = KindAccountSAS, p.rtypes
	} else {
		pr.Kind = KindServiceSAS
		pr.Table = strings.ToLower(p.raw["tn"])
		pr.Keys = KeyRange{StartPK: p.raw["spk"], StartRK: p.raw["srk"], EndPK: p.raw["epk"], EndRK: p.raw["erk"]}
		if id := p.raw["si"]; id != "" {
			if err := applyPolicy(&pr, p, all, account, id); err != nil {
				return Principal{}, err
			}
		}
	}
	if pr.Expiry.IsZero() {
		return Principal{}, authFailed("Signed expiry time must be specified, in the SAS or its stored access policy.")
	}
	if !pr.Start.IsZero() && !pr.Start.Before(pr.Expiry) {
		return Principal{}, authFailed("Signed expiry time [%s] must be after signed start time [%s]", pr.Expiry.Format(http.TimeFormat), pr.Start.Format(http.TimeFormat))
	}
	if now.Before(pr.Start) || now.After(pr.Expiry) {
		start := ""
		if !pr.Start.IsZero() {
			start = pr.Start.Format(http.TimeFormat)
		}
		return Principal{}, authFailed("Signature not valid in the specified time frame: Start [%s] - Expiry [%s] - Current [%s]",
			start, pr.Expiry.Format(http.TimeFormat), now.UTC().Format(http.TimeFormat))
	}
	if p.raw["spr"] == "https" && r.TLS == nil {
		return Principal{}, denied(CodeAuthorizationProtocolMismatch, "This request is not authorized to perform this operation using this protocol.")
	}
	if p.raw["sip"] != "" {
		ip := clientIP(r)
		if !ip.IsValid() || ip.Less(p.ipLo) || p.ipHi.Less(ip) {
			return Principal{}, denied(CodeAuthorizationSourceIPMismatch, fmt.Sprintf("This request is not authorized to perform this operation using this source IP %s.", ip))
		}
	}
	return pr, nil
}

// applyPolicy fills the fields a SAS leaves to its stored access
// policy; a field may be set in one place only, as the service requires.
func applyPolicy(pr *Principal, p *sasParams, all Keys, account, id string) error {
	pl, ok := all.(Policies)
	if !ok {
		return &Error{Code: CodeAuthenticationFailed, Status: http.StatusForbidden, Message: msgAuthenticationFailed,
			Detail: "The SAS names a stored access policy (si); stored access policies are not supported.", Err: ErrStoredPolicy}
	}
	pol, ok := pl.Policy(account, pr.Table, id)
	if !ok {
		return errFailure()
	}
	both := func(n string, set bool) bool { return p.raw[n] != "" && set }
	if both("sp", pol.Permissions != "") || both("st", !pol.Start.IsZero()) || both("se", !pol.Expiry.IsZero()) {
		return authFailed("A field is set both in the SAS and in its stored access policy %q.", id)
	}
	if pol.Permissions != "" {
		perms, err := parsePerms(pol.Permissions, false)
		if err != nil {
			return authFailed("stored access policy %q: %v", id, err)
		}
		pr.Perms = perms
	}
	if !pol.Start.IsZero() {
		pr.Start = pol.Start
	}
	if !pol.Expiry.IsZero() {
		pr.Expiry = pol.Expiry
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

// ServiceSASValues are the fields of a service SAS for one table.
type ServiceSASValues struct {
	Table                          string    // tn; signed lower-cased
	Permissions                    string    // sp: letters from "raud"
	Start                          time.Time // st; zero: valid at once
	Expiry                         time.Time // se; zero only with Identifier
	StartPK, StartRK, EndPK, EndRK string
	IP                             string // sip: "a.b.c.d" or "a.b.c.d-e.f.g.h"
	Protocol                       string // spr: "https" or "https,http"
	Version                        string // sv; "" means SASVersion
	Identifier                     string // si: a stored access policy
}

// ServiceSAS signs a service SAS for a table of account with key
// (decoded) and returns its query parameters, to add to a request's
// query.
func ServiceSAS(account string, key []byte, v ServiceSASValues) url.Values {
	q := url.Values{}
	set := func(n, s string) {
		if s != "" {
			q.Set(n, s)
		}
	}
	if v.Version == "" {
		v.Version = SASVersion
	}
	set("sv", v.Version)
	set("tn", strings.ToLower(v.Table))
	set("sp", v.Permissions)
	set("st", formatSASTime(v.Start))
	set("se", formatSASTime(v.Expiry))
	set("sip", v.IP)
	set("spr", v.Protocol)
	set("si", v.Identifier)
	set("spk", v.StartPK)
	set("srk", v.StartRK)
	set("epk", v.EndPK)
	set("erk", v.EndRK)
	p := &sasParams{raw: map[string]string{}}
	for n := range q {
		p.raw[n] = q.Get(n)
	}
	q.Set("sig", sign(key, p.stringToSign(account)))
	return q
}

// AccountSASValues are the fields of an account SAS.
type AccountSASValues struct {
	Permissions     string // sp: letters from "racwdlup"
	Services        string // ss: must contain "t" for tables
	ResourceTypes   string // srt: letters from "sco"
	Start           time.Time
	Expiry          time.Time
	IP              string
	Protocol        string
	Version         string // "" means SASVersion
	EncryptionScope string // ses; signed from sv 2020-12-06 on
}

// AccountSAS signs an account SAS for account with key (decoded) and
// returns its query parameters.
func AccountSAS(account string, key []byte, v AccountSASValues) url.Values {
	q := url.Values{}
	set := func(n, s string) {
		if s != "" {
			q.Set(n, s)
		}
	}
	if v.Version == "" {
		v.Version = SASVersion
	}
	set("sv", v.Version)
	set("ss", v.Services)
	set("srt", v.ResourceTypes)
	set("sp", v.Permissions)
	set("st", formatSASTime(v.Start))
	set("se", formatSASTime(v.Expiry))
	set("sip", v.IP)
	set("spr", v.Protocol)
	set("ses", v.EncryptionScope)
	p := &sasParams{raw: map[string]string{}, account: true}
	for n := range q {
		p.raw[n] = q.Get(n)
	}
	q.Set("sig", sign(key, p.stringToSign(account)))
	return q
}

func formatSASTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}
