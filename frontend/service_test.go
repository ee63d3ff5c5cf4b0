package frontend_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// corsProps are service properties with three CORS rules, as Azurite's
// suite sets them (only Cors: the other elements keep their values).
const corsProps = `<?xml version="1.0" encoding="utf-8"?><StorageServiceProperties><Cors>` +
	`<CorsRule><AllowedOrigins>http://www.contoso.com,http://www.fabrikam.com</AllowedOrigins><AllowedMethods>GET,HEAD,POST,OPTIONS,MERGE,PUT</AllowedMethods>` +
	`<MaxAgeInSeconds>100</MaxAgeInSeconds><ExposedHeaders>x-ms-*</ExposedHeaders><AllowedHeaders>x-ms-meta-abc,x-ms-meta-data*</AllowedHeaders></CorsRule>` +
	`<CorsRule><AllowedOrigins>*</AllowedOrigins><AllowedMethods>DELETE</AllowedMethods><MaxAgeInSeconds>2</MaxAgeInSeconds><ExposedHeaders>*</ExposedHeaders><AllowedHeaders>*</AllowedHeaders></CorsRule>` +
	`</Cors></StorageServiceProperties>`

// TestGatewayServiceProperties: Get answers the defaults until a Set;
// a Set keeps the elements it omits, is validated as the service does
// (400 InvalidXmlNodeValue / InvalidXmlDocument, nothing stored), and is
// durable: another gateway (no shared cache) reads it.
func TestGatewayServiceProperties(t *testing.T) {
	a := startGateway(t)
	st, h, b := a.do("GET", "/?restype=service&comp=properties", nil, nil)
	a.want("get service properties", 200, "", st, h, b)
	if !strings.Contains(string(b), "<StorageServiceProperties>") || !strings.Contains(string(b), "<Cors></Cors>") ||
		!strings.Contains(string(b), "<HourMetrics><Version>1.0</Version><Enabled>false</Enabled>") {
		t.Fatalf("default service properties: %s", b)
	}
	logging := `<StorageServiceProperties><Logging><Version>1.0</Version><Delete>true</Delete><Read>false</Read><Write>true</Write>` +
		`<RetentionPolicy><Enabled>true</Enabled><Days>7</Days></RetentionPolicy></Logging>` +
		`<MinuteMetrics><Version>1.0</Version><Enabled>true</Enabled><IncludeAPIs>false</IncludeAPIs><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy></MinuteMetrics></StorageServiceProperties>`
	st, h, b = a.do("PUT", "/?restype=service&comp=properties", nil, logging)
	a.want("set logging and minute metrics", 202, "", st, h, b)
	st, h, b = a.do("PUT", "/?restype=service&comp=properties", nil, corsProps)
	a.want("set cors", 202, "", st, h, b)

	bad := map[string]string{
		"six rules":  `<StorageServiceProperties><Cors>` + strings.Repeat(`<CorsRule><AllowedOrigins>*</AllowedOrigins><AllowedMethods>GET</AllowedMethods><MaxAgeInSeconds>1</MaxAgeInSeconds><ExposedHeaders/><AllowedHeaders/></CorsRule>`, 6) + `</Cors></StorageServiceProperties>`,
		"a method":   `<StorageServiceProperties><Cors><CorsRule><AllowedOrigins>*</AllowedOrigins><AllowedMethods>GET,PATCH</AllowedMethods><MaxAgeInSeconds>1</MaxAgeInSeconds><ExposedHeaders/><AllowedHeaders/></CorsRule></Cors></StorageServiceProperties>`,
		"max age":    `<StorageServiceProperties><Cors><CorsRule><AllowedOrigins>*</AllowedOrigins><AllowedMethods>GET</AllowedMethods><MaxAgeInSeconds>-1</MaxAgeInSeconds><ExposedHeaders/><AllowedHeaders/></CorsRule></Cors></StorageServiceProperties>`,
		"no origin":  `<StorageServiceProperties><Cors><CorsRule><AllowedOrigins></AllowedOrigins><AllowedMethods>GET</AllowedMethods><MaxAgeInSeconds>1</MaxAgeInSeconds><ExposedHeaders/><AllowedHeaders/></CorsRule></Cors></StorageServiceProperties>`,
		"3 prefixes": `<StorageServiceProperties><Cors><CorsRule><AllowedOrigins>*</AllowedOrigins><AllowedMethods>GET</AllowedMethods><MaxAgeInSeconds>1</MaxAgeInSeconds><ExposedHeaders/><AllowedHeaders>a*,b*,c*</AllowedHeaders></CorsRule></Cors></StorageServiceProperties>`,
		"days":       `<StorageServiceProperties><HourMetrics><Version>1.0</Version><Enabled>true</Enabled><IncludeAPIs>true</IncludeAPIs><RetentionPolicy><Enabled>true</Enabled><Days>366</Days></RetentionPolicy></HourMetrics></StorageServiceProperties>`,
		"apis":       `<StorageServiceProperties><HourMetrics><Version>1.0</Version><Enabled>true</Enabled><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy></HourMetrics></StorageServiceProperties>`,
		"a bool":     `<StorageServiceProperties><Logging><Version>1.0</Version><Delete>yes</Delete><Read>false</Read><Write>true</Write><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy></Logging></StorageServiceProperties>`,
	}
	for what, body := range bad {
		st, h, b = a.do("PUT", "/?restype=service&comp=properties", nil, body)
		a.want("refuse "+what, 400, "InvalidXmlNodeValue", st, h, b)
		if !strings.HasPrefix(h.Get("Content-Type"), "application/xml") || !strings.Contains(string(b), "<Code>InvalidXmlNodeValue</Code>") {
			t.Fatalf("refusal of %s is not the service's XML error: %s %s", what, h.Get("Content-Type"), b)
		}
	}
	st, h, b = a.do("PUT", "/?restype=service&comp=properties", nil, "<StorageServiceProperties><Cors>")
	a.want("refuse malformed XML", 400, "InvalidXmlDocument", st, h, b)

	b2 := a.secondGateway()
	st, h, b = b2.do("GET", "/?restype=service&comp=properties", nil, nil)
	a.want("get through another gateway", 200, "", st, h, b)
	for _, want := range []string{
		"<Logging><Version>1.0</Version><Delete>true</Delete><Read>false</Read><Write>true</Write><RetentionPolicy><Enabled>true</Enabled><Days>7</Days></RetentionPolicy></Logging>",
		"<MinuteMetrics><Version>1.0</Version><Enabled>true</Enabled><IncludeAPIs>false</IncludeAPIs>",
		"<AllowedOrigins>http://www.contoso.com,http://www.fabrikam.com</AllowedOrigins>",
		"<MaxAgeInSeconds>2</MaxAgeInSeconds>",
	} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("stored properties lack %s: %s", want, b)
		}
	}
	if strings.Count(string(b), "<CorsRule>") != 2 {
		t.Fatalf("want the 2 rules set (refused sets stored nothing): %s", b)
	}
}

// preflight sends an unauthenticated OPTIONS.
func (a *azure) preflight(origin, method, headers string) (int, http.Header, string) {
	a.t.Helper()
	req, err := http.NewRequest("OPTIONS", a.url+"/Tables", nil)
	if err != nil {
		a.t.Fatal(err)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if method != "" {
		req.Header.Set("Access-Control-Request-Method", method)
	}
	if headers != "" {
		req.Header.Set("Access-Control-Request-Headers", headers)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header, resp.Header.Get("x-ms-error-code")
}

// TestGatewayCORS: preflights succeed only when a rule allows the
// origin, the method and every requested header; actual requests from
// an allowed origin carry Access-Control-Allow-Origin and the exposed
// headers (errors too), others Vary: Origin only.
func TestGatewayCORS(t *testing.T) {
	a := startGateway(t)
	if st, _, code := a.preflight("http://www.contoso.com", "GET", ""); st != 403 || code != "CorsPreflightFailure" {
		t.Fatalf("preflight with no rules: %d %s", st, code)
	}
	st, h, b := a.do("GET", "/Tables", map[string]string{"Origin": "http://www.contoso.com"}, nil)
	a.want("request with no rules", 200, "", st, h, b)
	if h.Get("Access-Control-Allow-Origin") != "" || h.Get("Vary") != "" {
		t.Fatalf("CORS headers with no rules: %v", h)
	}
	st, h, b = a.do("PUT", "/?restype=service&comp=properties", nil, corsProps)
	a.want("set cors", 202, "", st, h, b)

	for _, c := range []struct {
		origin, method, headers string
		status                  int
		code                    string
	}{
		{"http://www.contoso.com", "PUT", "x-ms-meta-abc, x-ms-meta-data-1", 200, ""},
		{"HTTP://WWW.FABRIKAM.COM", "MERGE", "", 200, ""},
		{"http://elsewhere.example", "DELETE", "anything", 200, ""}, // the * rule
		{"http://www.contoso.com", "DELETE", "", 200, ""},           // falls through to the * rule
		{"http://elsewhere.example", "GET", "", 403, "CorsPreflightFailure"},
		{"http://www.contoso.com", "GET", "x-ms-meta-other", 403, "CorsPreflightFailure"},
		{"", "GET", "", 400, "InvalidHeaderValue"},
		{"http://www.contoso.com", "", "", 400, "InvalidHeaderValue"},
	} {
		st, h, code := a.preflight(c.origin, c.method, c.headers)
		if st != c.status || code != c.code {
			t.Fatalf("preflight %+v: %d %s", c, st, code)
		}
		if st == 200 && (h.Get("Access-Control-Allow-Origin") != c.origin || h.Get("Access-Control-Allow-Methods") != c.method ||
			h.Get("Access-Control-Allow-Headers") != c.headers || h.Get("Access-Control-Max-Age") == "") {
			t.Fatalf("preflight %+v answered %v", c, h)
		}
	}

	st, h, b = a.do("GET", "/Tables", map[string]string{"Origin": "http://www.contoso.com"}, nil)
	a.want("request from an allowed origin", 200, "", st, h, b)
	if h.Get("Access-Control-Allow-Origin") != "http://www.contoso.com" || h.Get("Vary") != "Origin" ||
		!strings.Contains(h.Get("Access-Control-Expose-Headers"), "x-ms-request-id") || strings.Contains(h.Get("Access-Control-Expose-Headers"), "content-type") {
		t.Fatalf("CORS headers of an allowed request: %v", h)
	}
	st, h, b = a.do("GET", "/Missing()", map[string]string{"Origin": "http://www.contoso.com"}, nil)
	a.want("failing request from an allowed origin", 404, "", st, h, b)
	if h.Get("Access-Control-Allow-Origin") != "http://www.contoso.com" || !strings.Contains(h.Get("Access-Control-Expose-Headers"), "x-ms-error-code") {
		t.Fatalf("CORS headers of a failed request: %v", h)
	}
	st, h, b = a.do("DELETE", "/Tables('Missing')", map[string]string{"Origin": "http://any.example"}, nil)
	a.want("request matched by the * rule", 404, "", st, h, b)
	if h.Get("Access-Control-Allow-Origin") != "*" || h.Get("Vary") != "" || h.Get("Access-Control-Expose-Headers") == "" {
		t.Fatalf("CORS headers of a * rule: %v", h)
	}
	st, h, b = a.do("GET", "/Tables", map[string]string{"Origin": "http://any.example"}, nil)
	a.want("request matching no rule", 200, "", st, h, b)
	if h.Get("Access-Control-Allow-Origin") != "" || h.Get("Vary") != "Origin" {
		t.Fatalf("CORS headers when no rule matches: %v", h)
	}
}

// TestGatewayServiceStats: statistics are served on the secondary
// endpoint (geo-replication live) and refused on the primary.
func TestGatewayServiceStats(t *testing.T) {
	a := startGateway(t)
	st, h, b := a.do("GET", "/?restype=service&comp=stats", nil, nil)
	a.want("stats on the primary", 400, "InvalidQueryParameterValue", st, h, b)
	sec := *a
	sec.url = strings.TrimSuffix(a.url, "/acct") + "/acct-secondary"
	st, h, b = sec.do("GET", "/?restype=service&comp=stats", nil, nil)
	a.want("stats on the secondary", 200, "", st, h, b)
	if !strings.Contains(string(b), "<GeoReplication><Status>live</Status><LastSyncTime>") {
		t.Fatalf("stats: %s", b)
	}
	st, h, b = sec.do("PUT", "/?restype=service&comp=properties", nil, corsProps)
	a.want("set on the secondary", 403, "AuthorizationFailure", st, h, b)
}

// TestGatewayTableACL: Set Table ACL stores up to five policies; a
// service SAS naming one (si) takes the fields it leaves out from it, may
// not set one the policy sets, and is revoked when the policy is removed,
// through any gateway; a dropped table's policies are gone.
func TestGatewayTableACL(t *testing.T) {
	a := startGateway(t)
	st, h, b := a.do("POST", "/Tables", nil, map[string]string{"TableName": "Acl"})
	a.want("create table", 201, "", st, h, b)
	st, h, b = a.do("GET", "/Acl?comp=acl", nil, nil)
	a.want("get empty acl", 200, "", st, h, b)
	if !strings.Contains(string(b), "<SignedIdentifiers></SignedIdentifiers>") {
		t.Fatalf("empty acl: %s", b)
	}
	st, h, b = a.do("GET", "/Nope?comp=acl", nil, nil)
	a.want("acl of a missing table", 404, "ResourceNotFound", st, h, b)
	st, h, b = a.do("PUT", "/Nope?comp=acl", nil, "<SignedIdentifiers/>")
	a.want("set acl of a missing table", 404, "ResourceNotFound", st, h, b)

	expiry := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	acl := `<?xml version="1.0" encoding="utf-8"?><SignedIdentifiers>` +
		`<SignedIdentifier><Id>readers</Id><AccessPolicy><Start>2020-01-01T00:00:00Z</Start><Expiry>` + expiry + `</Expiry><Permission>r</Permission></AccessPolicy></SignedIdentifier>` +
		`<SignedIdentifier><Id>open</Id><AccessPolicy><Permission>raud</Permission></AccessPolicy></SignedIdentifier>` +
		`</SignedIdentifiers>`
	st, h, b = a.do("PUT", "/Acl?comp=acl", nil, acl)
	a.want("set acl", 204, "", st, h, b)
	st, h, b = a.do("GET", "/Acl?comp=acl", nil, nil)
	a.want("get acl", 200, "", st, h, b)
	if !strings.Contains(string(b), "<Id>readers</Id><AccessPolicy><Start>2020-01-01T00:00:00.0000000Z</Start>") ||
		!strings.Contains(string(b), "<Id>open</Id><AccessPolicy><Permission>raud</Permission>") {
		t.Fatalf("acl: %s", b)
	}
	six := "<SignedIdentifiers>" + strings.Repeat("<SignedIdentifier><Id>x</Id></SignedIdentifier>", 6) + "</SignedIdentifiers>"
	st, h, b = a.do("PUT", "/Acl?comp=acl", nil, six)
	a.want("six policies", 400, "InvalidXmlDocument", st, h, b)
	st, h, b = a.do("PUT", "/Acl?comp=acl", nil, `<SignedIdentifiers><SignedIdentifier><Id>x</Id><AccessPolicy><Permission>rw</Permission></AccessPolicy></SignedIdentifier></SignedIdentifiers>`)
	a.want("a bad permission", 400, "InvalidXmlNodeValue", st, h, b)
	st, h, b = a.do("PUT", "/Acl?comp=acl", nil, "<SignedIdentifiers><SignedIdentifier><Id>"+strings.Repeat("i", 65)+"</Id></SignedIdentifier></SignedIdentifiers>")
	a.want("a long id", 400, "InvalidXmlNodeValue", st, h, b)

	st, h, b = a.do("PUT", "/Acl(PartitionKey='p',RowKey='r')", nil, map[string]string{"PartitionKey": "p", "RowKey": "r"})
	a.want("insert", 204, "", st, h, b)
	sas := func(v sharedkey.ServiceSASValues) *azure {
		v.Table = "Acl"
		s := *a
		s.key = nil
		s.sasQuery = sharedkey.ServiceSAS(a.account, a.key, v).Encode()
		return &s
	}
	readers := sas(sharedkey.ServiceSASValues{Identifier: "readers"})
	st, h, b = readers.do("GET", "/Acl(PartitionKey='p',RowKey='r')", nil, nil)
	a.want("read by the readers policy", 200, "", st, h, b)
	st, h, b = readers.do("DELETE", "/Acl(PartitionKey='p',RowKey='r')", map[string]string{"If-Match": "*"}, nil)
	a.want("delete by the readers policy", 403, "AuthorizationPermissionMismatch", st, h, b)
	both := sas(sharedkey.ServiceSASValues{Identifier: "readers", Permissions: "r"})
	st, h, b = both.do("GET", "/Acl(PartitionKey='p',RowKey='r')", nil, nil)
	a.want("sp in the SAS and the policy", 403, "AuthenticationFailed", st, h, b)
	open := sas(sharedkey.ServiceSASValues{Identifier: "open", Expiry: time.Now().Add(time.Hour)})
	st, h, b = open.do("GET", "/Acl(PartitionKey='p',RowKey='r')", nil, nil)
	a.want("read by the open policy, expiry in the SAS", 200, "", st, h, b)
	noExpiry := sas(sharedkey.ServiceSASValues{Identifier: "open"})
	st, h, b = noExpiry.do("GET", "/Acl(PartitionKey='p',RowKey='r')", nil, nil)
	a.want("no expiry anywhere", 403, "AuthenticationFailed", st, h, b)
	unknown := sas(sharedkey.ServiceSASValues{Identifier: "nobody"})
	st, h, b = unknown.do("GET", "/Acl(PartitionKey='p',RowKey='r')", nil, nil)
	a.want("an unknown policy", 403, "AuthorizationFailure", st, h, b)

	// Revoke "readers" through another gateway: this one sees it at once.
	b2 := a.secondGateway()
	st, h, b = b2.do("PUT", "/Acl?comp=acl", nil, `<SignedIdentifiers><SignedIdentifier><Id>open</Id><AccessPolicy><Permission>raud</Permission></AccessPolicy></SignedIdentifier></SignedIdentifiers>`)
	a.want("revoke readers", 204, "", st, h, b)
	st, h, b = readers.do("GET", "/Acl(PartitionKey='p',RowKey='r')", nil, nil)
	a.want("read by a revoked policy", 403, "AuthorizationFailure", st, h, b)

	st, h, b = a.do("DELETE", "/Tables('Acl')", nil, nil)
	a.want("drop", 204, "", st, h, b)
	st, h, b = a.do("POST", "/Tables", nil, map[string]string{"TableName": "acl"})
	a.want("create again", 201, "", st, h, b)
	st, h, b = a.do("GET", "/acl?comp=acl", nil, nil)
	a.want("acl of the new table", 200, "", st, h, b)
	if strings.Contains(string(b), "<Id>") {
		t.Fatalf("a new table inherited policies: %s", b)
	}
}
