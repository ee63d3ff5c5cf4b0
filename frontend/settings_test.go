package frontend

import (
	"errors"
	"testing"
)

// TestSettingFrame: a stored setting round-trips; a flipped bit anywhere
// and an unknown version are ErrSettingsCorrupt, never served.
func TestSettingFrame(t *testing.T) {
	p := defaultServiceProps()
	p.Cors.Rules = []corsRule{{AllowedOrigins: "*", AllowedMethods: "GET", MaxAgeInSeconds: "5"}}
	b, err := encodeSetting(p)
	if err != nil {
		t.Fatal(err)
	}
	var got serviceProps
	if err := decodeSetting(b, &got); err != nil || len(got.Cors.Rules) != 1 || got.Cors.Rules[0].MaxAgeInSeconds != "5" {
		t.Fatalf("round trip: %v %+v", err, got)
	}
	for i := range len(b) * 8 {
		c := append([]byte(nil), b...)
		c[i/8] ^= 1 << (i % 8)
		if err := decodeSetting(c, &serviceProps{}); !errors.Is(err, ErrSettingsCorrupt) {
			t.Fatalf("bit %d flipped: %v", i, err)
		}
	}
	if err := decodeSetting(b[:3], &serviceProps{}); !errors.Is(err, ErrSettingsCorrupt) {
		t.Fatalf("truncated: %v", err)
	}
}

func FuzzDecodeSetting(f *testing.F) {
	b, _ := encodeSetting(defaultServiceProps())
	f.Add(b)
	b, _ = encodeSetting([]signedIdentifier{{ID: "x", Policy: &accessPolicy{Permission: "r"}}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var p serviceProps
		_ = decodeSetting(b, &p)
		var ids []signedIdentifier
		_ = decodeSetting(b, &ids)
	})
}

// FuzzParseServiceProps: any body is refused with an error or accepted
// as properties that render, store and read back to the same XML.
func FuzzParseServiceProps(f *testing.F) {
	f.Add([]byte(`<StorageServiceProperties><Cors><CorsRule><AllowedOrigins>*</AllowedOrigins><AllowedMethods>GET,PUT</AllowedMethods><MaxAgeInSeconds>5</MaxAgeInSeconds><ExposedHeaders>x-ms-*</ExposedHeaders><AllowedHeaders/></CorsRule></Cors></StorageServiceProperties>`))
	f.Add([]byte(`<StorageServiceProperties><Logging><Version>1.0</Version><Delete>true</Delete><Read>false</Read><Write>true</Write><RetentionPolicy><Enabled>true</Enabled><Days>7</Days></RetentionPolicy></Logging></StorageServiceProperties>`))
	f.Add([]byte(`<StorageServiceProperties><HourMetrics><Version>1.0</Version><Enabled>true</Enabled><IncludeAPIs>false</IncludeAPIs><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy></HourMetrics></StorageServiceProperties>`))
	f.Add([]byte(`<StorageServiceProperties/>`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseServiceProps(body)
		if err != nil {
			return
		}
		merged := defaultServiceProps()
		merged.merge(p)
		b, err := encodeSetting(merged)
		if err != nil {
			t.Fatal(err)
		}
		back := defaultServiceProps()
		if err := decodeSetting(b, back); err != nil {
			t.Fatal(err)
		}
		if string(back.xmlBody()) != string(merged.xmlBody()) {
			t.Fatalf("stored and read back differ:\n%s\n%s", merged.xmlBody(), back.xmlBody())
		}
	})
}

// FuzzParseACL: any body is refused or gives at most five valid
// policies whose rendering parses back to the same.
func FuzzParseACL(f *testing.F) {
	f.Add([]byte(`<SignedIdentifiers><SignedIdentifier><Id>a</Id><AccessPolicy><Start>2020-01-01T00:00:00Z</Start><Expiry>2030-01-01T00:00:00.0000000Z</Expiry><Permission>raud</Permission></AccessPolicy></SignedIdentifier></SignedIdentifiers>`))
	f.Add([]byte(`<SignedIdentifiers/>`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, body []byte) {
		ids, err := parseACL(body)
		if err != nil {
			return
		}
		if len(ids) > maxSignedIdentifiers {
			t.Fatalf("%d identifiers accepted", len(ids))
		}
		again, err := parseACL(aclXML(ids))
		if err != nil {
			t.Fatalf("rendered ACL does not parse: %v\n%s", err, aclXML(ids))
		}
		if string(aclXML(again)) != string(aclXML(ids)) {
			t.Fatalf("ACL changed on a round trip:\n%s\n%s", aclXML(ids), aclXML(again))
		}
	})
}
