package queue

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/sharedkey"
)

var timeZero = time.Unix(0, 0)

func FuzzDecodeMessage(f *testing.F) {
	f.Add(encodeMessage(&messageRecord{Inserted: 1, Expires: never, Receipt: "r", Text: "t"}))
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b)
		if err != nil {
			return
		}
		if len(m.Receipt) > 255 {
			t.Fatalf("receipt of %d bytes", len(m.Receipt))
		}
		again, err := decodeMessage(encodeMessage(m))
		if err != nil || *again != *m {
			t.Fatalf("re-encode of %+v: %+v, %v", m, again, err)
		}
	})
}

func FuzzDecodeQueue(f *testing.F) {
	f.Add(encodeQueue(&queueRecord{Gen: 1, Metadata: []metaPair{{"a", "b"}}, ACL: []accessPolicy{{ID: "x", Permission: "r"}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, err := decodeQueue(b); err == nil {
			if _, err := decodeQueue(encodeQueue(q)); err != nil {
				t.Fatalf("re-encode: %v", err)
			}
		}
	})
}

func FuzzDecodeMessageText(f *testing.F) {
	for _, s := range []string{"<QueueMessage><MessageText>hi</MessageText></QueueMessage>", "<queuemessage><messagetext>a&amp;b</messagetext></queuemessage>",
		"", "<QueueMessage/>", "<a><b>", "<QueueMessage><MessageText><x>y</x></MessageText></QueueMessage>"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		text, ok, err := decodeMessageText(b)
		if err != nil || !ok {
			return
		}
		// What a client reads back is what was put.
		round := "<QueueMessage><MessageText>" + escapeText(text).Inner + "</MessageText></QueueMessage>"
		back, ok, err := decodeMessageText([]byte(round))
		if err != nil || !ok || back != strings.ToValidUTF8(back, "\uFFFD") && back != text {
			t.Fatalf("text %q round-tripped to %q, %v, %v", text, back, ok, err)
		}
	})
}

func FuzzDecodeACL(f *testing.F) {
	f.Add([]byte(`<SignedIdentifiers><SignedIdentifier><Id>p</Id><AccessPolicy><Start>2020-01-01T00:00:00Z</Start><Expiry>2030-01-01</Expiry><Permission>raup</Permission></AccessPolicy></SignedIdentifier></SignedIdentifiers>`))
	f.Add([]byte(`<SignedIdentifiers/>`))
	f.Fuzz(func(t *testing.T, b []byte) {
		acl, err := decodeACL(b)
		if err != nil {
			return
		}
		if len(acl) > maxPolicies {
			t.Fatalf("%d policies accepted", len(acl))
		}
		back, err := decodeACL(encodeACL(acl))
		if err != nil || len(back) != len(acl) {
			t.Fatalf("re-encode of %+v: %+v, %v", acl, back, err)
		}
	})
}

func FuzzDecodeServiceProps(f *testing.F) {
	f.Add([]byte(`<StorageServiceProperties><Cors><CorsRule><AllowedOrigins>*</AllowedOrigins></CorsRule></Cors></StorageServiceProperties>`))
	f.Add(marshalXML(defaultServiceProps()))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeServiceProps(b)
		if err != nil {
			return
		}
		d := defaultServiceProps()
		d.merge(p)
		if _, err := decodeServiceProps(marshalXML(d)); err != nil {
			t.Fatalf("merged properties do not decode: %v", err)
		}
	})
}

func FuzzQueryParams(f *testing.F) {
	for _, s := range []string{"visibilitytimeout=10&messagettl=20", "messagettl=-1", "messagettl=0", "visibilitytimeout=x", "messagettl=99999999999999999999",
		"numofmessages=32", "sv=2019-12-12&sp=raup&se=2030-01-01&sig=AAAA", "sv=2019-12-12&ss=q&srt=sco&sp=rl&se=2030-01-01T00:00:00Z&sip=1.2.3.4-1.2.3.9&sig=" + url.QueryEscape(strings.Repeat("A", 43)+"=")} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		if vis, ttl, err := putParams(q); err == nil {
			if vis < 0 || vis > maxVisibility*time.Second || ttl < 0 || ttl != 0 && ttl <= vis {
				t.Fatalf("putParams(%q) = %v, %v", raw, vis, ttl)
			}
		}
		if n, err := intParam(q, "numofmessages", 1, maxNumMessages, 1); err == nil && (n < 1 || n > maxNumMessages) {
			t.Fatalf("numofmessages %d accepted", n)
		}
		_, _ = parseSAS(q)
		// Verifying never panics, whatever the query.
		r, err := http.NewRequest("GET", "http://h/acct/q1/messages?"+raw, nil)
		if err != nil {
			return
		}
		_, _ = verify(r, "acct", "q1", sharedkey.StaticKeys{"acct": {[]byte("k")}},
			func(string, string) (accessPolicy, bool, error) { return accessPolicy{Expiry: "2030-01-01"}, true, nil }, timeZero)
	})
}
