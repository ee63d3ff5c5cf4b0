package sharedkey

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

var expiry2030 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func sasRequest(method, path string, q url.Values) *http.Request {
	r := httptest.NewRequest(method, path+"?"+q.Encode(), nil)
	r.RemoteAddr = "10.1.2.3:5555"
	return r
}

// Known answers computed with openssl over the documented strings to
// sign, for the tokens aztables v1.4.1 makes (sv 2019-02-02, times
// "2006-01-02T15:04:05Z", tn lower-cased).
func TestSASKnownAnswers(t *testing.T) {
	svc := url.Values{"sv": {"2019-02-02"}, "tn": {"mytable"}, "sp": {"raud"}, "se": {"2030-01-01T00:00:00Z"},
		"sig": {"VH1kJ2dMcGJPJnFMefVZ3HMd1fedSci/031kWIgJz0w="}}
	p, err := Verify(sasRequest("GET", "/devstoreaccount1/mytable()", svc), DevAccount, DevKeys(), testNow)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != KindServiceSAS || p.Table != "mytable" || p.Perms != PermRead|PermAdd|PermUpdate|PermDelete || p.Version != "2019-02-02" || !p.Expiry.Equal(expiry2030) {
		t.Fatalf("principal %+v", p)
	}
	if got := ServiceSAS(DevAccount, devKey(), ServiceSASValues{Table: "MyTable", Permissions: "raud", Expiry: expiry2030}); got.Encode() != svc.Encode() {
		t.Fatalf("ServiceSAS = %s, want %s", got.Encode(), svc.Encode())
	}

	acct := url.Values{"sv": {"2019-02-02"}, "ss": {"t"}, "srt": {"sco"}, "sp": {"rl"}, "se": {"2030-01-01T00:00:00Z"},
		"sig": {"6atERsp82qDGsajntf9Es3ucADuU+5Mh/vk0jf0U1tw="}}
	p, err = Verify(sasRequest("GET", "/devstoreaccount1/Tables", acct), DevAccount, DevKeys(), testNow)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != KindAccountSAS || p.ResourceTypes != ResAll || p.Perms != PermRead|PermList {
		t.Fatalf("principal %+v", p)
	}
	if got := AccountSAS(DevAccount, devKey(), AccountSASValues{Permissions: "rl", Services: "t", ResourceTypes: "sco", Expiry: expiry2030}); got.Encode() != acct.Encode() {
		t.Fatalf("AccountSAS = %s, want %s", got.Encode(), acct.Encode())
	}
}

func TestServiceSAS(t *testing.T) {
	key := devKey()
	base := ServiceSASValues{Table: "mytable", Permissions: "r", Start: testNow.Add(-time.Hour), Expiry: testNow.Add(time.Hour)}
	verify := func(v ServiceSASValues, method string) (Principal, error) {
		return Verify(sasRequest(method, "/devstoreaccount1/mytable()", ServiceSAS(DevAccount, key, v)), DevAccount, DevKeys(), testNow)
	}
	p, err := verify(base, "GET")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Allows(OpQueryEntities, "MyTable", "", ""); err != nil {
		t.Errorf("read with sp=r: %v", err)
	}
	wantCode(t, p.Allows(OpInsertEntity, "mytable", "p", "r"), CodeAuthorizationPermissionMismatch)
	wantCode(t, p.Allows(OpDeleteEntity, "mytable", "p", "r"), CodeAuthorizationPermissionMismatch)
	wantCode(t, p.Allows(OpQueryEntities, "othertable", "", ""), CodeAuthorizationFailure)
	wantCode(t, p.Allows(OpQueryTables, "", "", ""), CodeAuthorizationResourceTypeMismatch)
	wantCode(t, p.Allows(OpCreateTable, "mytable", "", ""), CodeAuthorizationResourceTypeMismatch)

	// Expired, not yet valid, expiry before start.
	v := base
	v.Expiry = testNow.Add(-time.Minute)
	v.Start = time.Time{}
	e := wantCode(t, errOf(verify(v, "GET")), CodeAuthenticationFailed)
	if !strings.Contains(e.Detail, "not valid in the specified time frame") {
		t.Errorf("detail %q", e.Detail)
	}
	v = base
	v.Start = testNow.Add(time.Minute)
	wantCode(t, errOf(verify(v, "GET")), CodeAuthenticationFailed)
	v.Expiry = v.Start.Add(-time.Second)
	wantCode(t, errOf(verify(v, "GET")), CodeAuthenticationFailed)

	// Upserts need add and update.
	v = base
	v.Permissions = "a"
	p, _ = verify(v, "PUT")
	if err := p.Allows(OpInsertEntity, "mytable", "p", "r"); err != nil {
		t.Error(err)
	}
	wantCode(t, p.Allows(OpInsertOrMergeEntity, "mytable", "p", "r"), CodeAuthorizationPermissionMismatch)
	v.Permissions = "au"
	p, _ = verify(v, "PUT")
	if err := p.Allows(OpInsertOrReplaceEntity, "mytable", "p", "r"); err != nil {
		t.Error(err)
	}

	// Key ranges, ends included.
	v = base
	v.Permissions = "raud"
	v.StartPK, v.StartRK, v.EndPK, v.EndRK = "b", "5", "d", "5"
	p, err = verify(v, "POST")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pk, rk string
		in     bool
	}{{"b", "5", true}, {"b", "4", false}, {"a", "9", false}, {"c", "", true}, {"d", "5", true}, {"d", "6", false}, {"e", "0", false}} {
		err := p.Allows(OpInsertEntity, "mytable", c.pk, c.rk)
		if c.in && err != nil {
			t.Errorf("(%s,%s): %v", c.pk, c.rk, err)
		}
		if !c.in {
			wantCode(t, err, CodeAuthorizationFailure)
		}
	}

	// Protocol and IP.
	v = base
	v.Protocol = "https"
	q := ServiceSAS(DevAccount, key, v)
	wantCode(t, errOf(Verify(sasRequest("GET", "/devstoreaccount1/mytable()", q), DevAccount, DevKeys(), testNow)), CodeAuthorizationProtocolMismatch)
	r := sasRequest("GET", "/devstoreaccount1/mytable()", q)
	r.TLS = &tls.ConnectionState{}
	if _, err := Verify(r, DevAccount, DevKeys(), testNow); err != nil {
		t.Errorf("https: %v", err)
	}
	v = base
	v.IP = "10.1.2.0-10.1.2.255"
	q = ServiceSAS(DevAccount, key, v)
	if _, err := Verify(sasRequest("GET", "/devstoreaccount1/mytable()", q), DevAccount, DevKeys(), testNow); err != nil {
		t.Errorf("ip in range: %v", err)
	}
	v.IP = "10.9.9.9"
	q = ServiceSAS(DevAccount, key, v)
	wantCode(t, errOf(Verify(sasRequest("GET", "/devstoreaccount1/mytable()", q), DevAccount, DevKeys(), testNow)), CodeAuthorizationSourceIPMismatch)
}

func TestSASTampered(t *testing.T) {
	v := ServiceSASValues{Table: "mytable", Permissions: "r", Start: testNow.Add(-time.Hour), Expiry: testNow.Add(time.Hour),
		StartPK: "a", EndPK: "m", IP: "10.0.0.0-10.255.255.255", Protocol: "https,http"}
	good := ServiceSAS(DevAccount, devKey(), v)
	if _, err := Verify(sasRequest("GET", "/devstoreaccount1/mytable()", good), DevAccount, DevKeys(), testNow); err != nil {
		t.Fatal(err)
	}
	changes := map[string]string{"sp": "raud", "st": "2024-05-06T05:00:00Z", "se": "2031-01-01T00:00:00Z", "tn": "other",
		"spk": "0", "srk": "x", "epk": "z", "erk": "x", "sip": "10.0.0.0-10.255.255.254", "spr": "https", "sv": "2020-02-10", "si": "policy"}
	for name, val := range changes {
		q := url.Values{}
		for k, vs := range good {
			q[k] = vs
		}
		q.Set(name, val)
		_, err := Verify(sasRequest("GET", "/devstoreaccount1/mytable()", q), DevAccount, DevKeys(), testNow)
		wantCode(t, err, CodeAuthenticationFailed)
	}
	// The same token, another account.
	keys := StaticKeys{"acct2": {devKey()}}
	wantCode(t, errOf(Verify(sasRequest("GET", "/acct2/mytable()", good), "acct2", keys, testNow)), CodeAuthenticationFailed)
	// A repeated parameter.
	q := url.Values{}
	for k, vs := range good {
		q[k] = vs
	}
	q.Add("sp", "r")
	wantCode(t, errOf(Verify(sasRequest("GET", "/devstoreaccount1/mytable()", q), DevAccount, DevKeys(), testNow)), CodeAuthenticationFailed)
}

type policyKeys struct {
	StaticKeys
	policies map[string]Policy
}

func (p policyKeys) Policy(account, table, id string) (Policy, bool) {
	pol, ok := p.policies[account+"/"+table+"/"+id]
	return pol, ok
}

func TestStoredPolicies(t *testing.T) {
	v := ServiceSASValues{Table: "mytable", Identifier: "readers"}
	q := ServiceSAS(DevAccount, devKey(), v)
	_, err := Verify(sasRequest("GET", "/devstoreaccount1/mytable()", q), DevAccount, DevKeys(), testNow)
	wantCode(t, err, CodeAuthenticationFailed)
	if !errors.Is(err, ErrStoredPolicy) {
		t.Fatalf("err = %v, want ErrStoredPolicy", err)
	}

	keys := policyKeys{DevKeys(), map[string]Policy{
		DevAccount + "/mytable/readers": {Permissions: "r", Expiry: testNow.Add(time.Hour)},
		DevAccount + "/mytable/old":     {Permissions: "r", Expiry: testNow.Add(-time.Hour)},
	}}
	p, err := Verify(sasRequest("GET", "/devstoreaccount1/mytable()", q), DevAccount, keys, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if p.Perms != PermRead || !p.Expiry.Equal(testNow.Add(time.Hour)) {
		t.Fatalf("principal %+v", p)
	}
	v.Identifier = "old"
	wantCode(t, errOf(Verify(sasRequest("GET", "/devstoreaccount1/mytable()", ServiceSAS(DevAccount, devKey(), v)), DevAccount, keys, testNow)), CodeAuthenticationFailed)
	v.Identifier = "missing"
	wantCode(t, errOf(Verify(sasRequest("GET", "/devstoreaccount1/mytable()", ServiceSAS(DevAccount, devKey(), v)), DevAccount, keys, testNow)), CodeAuthorizationFailure)
	// A field in both the SAS and the policy.
	v = ServiceSASValues{Table: "mytable", Identifier: "readers", Permissions: "r"}
	wantCode(t, errOf(Verify(sasRequest("GET", "/devstoreaccount1/mytable()", ServiceSAS(DevAccount, devKey(), v)), DevAccount, keys, testNow)), CodeAuthenticationFailed)
}

func TestAccountSAS(t *testing.T) {
	base := AccountSASValues{Permissions: "r", Services: "bt", ResourceTypes: "o", Expiry: testNow.Add(time.Hour)}
	verify := func(v AccountSASValues) (Principal, error) {
		return Verify(sasRequest("GET", "/devstoreaccount1/mytable()", AccountSAS(DevAccount, devKey(), v)), DevAccount, DevKeys(), testNow)
	}
	p, err := verify(base)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Allows(OpGetEntity, "anytable", "p", "r"); err != nil {
		t.Error(err)
	}
	wantCode(t, p.Allows(OpQueryTables, "", "", ""), CodeAuthorizationResourceTypeMismatch)
	wantCode(t, p.Allows(OpGetServiceProperties, "", "", ""), CodeAuthorizationResourceTypeMismatch)
	wantCode(t, p.Allows(OpMergeEntity, "t", "p", "r"), CodeAuthorizationPermissionMismatch)

	v := base
	v.Services = "bq"
	wantCode(t, errOf(verify(v)), CodeAuthorizationServiceMismatch)

	v = base
	v.ResourceTypes, v.Permissions = "sc", "rwdlacup"
	p, err = verify(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []Op{OpQueryTables, OpCreateTable, OpDeleteTable, OpGetServiceProperties, OpSetServiceProperties, OpGetServiceStats} {
		if err := p.Allows(op, "t", "", ""); err != nil {
			t.Errorf("op %d: %v", op, err)
		}
	}
	wantCode(t, p.Allows(OpGetTableACL, "t", "", ""), CodeAuthorizationPermissionMismatch)
	wantCode(t, p.Allows(OpInsertEntity, "t", "p", "r"), CodeAuthorizationResourceTypeMismatch)

	// From sv 2020-12-06 the signature covers ses.
	v = base
	v.Version, v.EncryptionScope = "2020-12-06", "scope1"
	q := AccountSAS(DevAccount, devKey(), v)
	if _, err := Verify(sasRequest("GET", "/devstoreaccount1/t()", q), DevAccount, DevKeys(), testNow); err != nil {
		t.Fatal(err)
	}
	q.Set("ses", "scope2")
	wantCode(t, errOf(Verify(sasRequest("GET", "/devstoreaccount1/t()", q), DevAccount, DevKeys(), testNow)), CodeAuthenticationFailed)

	// Expired; a letter of no service.
	v = base
	v.Expiry = testNow.Add(-time.Second)
	wantCode(t, errOf(verify(v)), CodeAuthenticationFailed)
	v = base
	v.Permissions = "rq"
	wantCode(t, errOf(verify(v)), CodeAuthenticationFailed)
}

func TestParseSASTimes(t *testing.T) {
	for _, s := range []string{"2030-01-01T00:00:00Z", "2030-01-01T00:00:00.1234567Z", "2030-01-01T00:00Z", "2030-01-01", "2030-01-01T01:00:00+01:00"} {
		got, err := ParseSASTime(s)
		if err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		if got.Truncate(time.Second) != expiry2030 {
			t.Errorf("%s = %v", s, got)
		}
	}
	for _, s := range []string{"", "2030-13-01", "tomorrow", "2030-01-01T00:00:00"} {
		if _, err := ParseSASTime(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func FuzzParseSAS(f *testing.F) {
	f.Add(ServiceSAS(DevAccount, devKey(), ServiceSASValues{Table: "t", Permissions: "raud", Expiry: expiry2030, StartPK: "a", EndPK: "b", IP: "10.0.0.1"}).Encode())
	f.Add(AccountSAS(DevAccount, devKey(), AccountSASValues{Permissions: "rl", Services: "t", ResourceTypes: "sco", Expiry: expiry2030, Version: "2021-08-06", EncryptionScope: "x"}).Encode())
	f.Add("sv=2019-02-02&sig=%3D%3D&sp=rr&se=x&sip=1.2.3.4-::1")
	f.Add("")
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		p, perr := parseSAS(q)
		if perr == nil {
			if len(p.sig) != 32 || p.raw["sv"] < minSASVersion || p.expiry.IsZero() && p.raw["si"] == "" {
				t.Fatalf("accepted %q: %+v", raw, p)
			}
			_ = p.stringToSign(DevAccount)
		}
		r := httptest.NewRequest("GET", "/devstoreaccount1/t()", nil)
		r.URL.RawQuery = raw
		pr, err := Verify(r, DevAccount, DevKeys(), testNow)
		if err == nil {
			if perr != nil || pr.Kind != KindServiceSAS && pr.Kind != KindAccountSAS || pr.Version != q.Get("sv") {
				t.Fatalf("accepted %q as %+v (parse: %v)", raw, pr, perr)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) || e.Status != http.StatusForbidden {
			t.Fatalf("error %v", err)
		}
	})
}
