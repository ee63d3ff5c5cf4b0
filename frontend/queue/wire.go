package queue

// The service's XML bodies in and out, and its query parameters.

import (
	"bytes"
	"encoding/hex"
	"encoding/xml"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// Limits of the service.
const (
	maxMessageText   = 64 << 10 // bytes of MessageText as sent
	maxBody          = 1 << 20  // any request body
	maxNumMessages   = 32
	maxVisibility    = 7 * 24 * 3600 // seconds
	defaultTTL       = 7 * 24 * 3600 // seconds
	defaultDequeueVT = 30            // seconds
	maxListResults   = 5000
	maxPolicies      = 5
	maxTTL           = 100 * 365 * 24 * 3600 // seconds; a longer one never expires
)

// decodeMessageText reads a QueueMessage body's MessageText: ok is false
// when the body has none. Element names are matched without regard to
// case, as Azurite does.
func decodeMessageText(body []byte) (text string, ok bool, err error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return "", false, nil
	}
	d := xml.NewDecoder(bytes.NewReader(body))
	depth := 0
	in := false
	var b strings.Builder
	rootSeen := false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			if !rootSeen || depth != 0 {
				return "", false, errInvalidXML
			}
			return b.String(), ok, nil
		}
		if err != nil {
			return "", false, errInvalidXML
		}
		switch t := tok.(type) {
		case xml.StartElement:
			depth++
			switch {
			case depth == 1:
				if rootSeen || !strings.EqualFold(t.Name.Local, "QueueMessage") {
					return "", false, errInvalidXML
				}
				rootSeen = true
			case depth == 2 && strings.EqualFold(t.Name.Local, "MessageText") && !ok:
				in, ok = true, true
			}
		case xml.EndElement:
			if depth == 2 {
				in = false
			}
			depth--
		case xml.CharData:
			if in && depth == 2 {
				b.Write(t)
			}
		}
	}
}

type xmlAccessPolicy struct {
	Start      string `xml:"Start,omitempty"`
	Expiry     string `xml:"Expiry,omitempty"`
	Permission string `xml:"Permission,omitempty"`
}

type xmlSignedIdentifier struct {
	ID           string          `xml:"Id"`
	AccessPolicy xmlAccessPolicy `xml:"AccessPolicy"`
}

type xmlSignedIdentifiers struct {
	XMLName     xml.Name              `xml:"SignedIdentifiers"`
	Identifiers []xmlSignedIdentifier `xml:"SignedIdentifier"`
}

// decodeACL reads a Set Queue ACL body: at most five policies, their
// permissions from "raup".
func decodeACL(body []byte) ([]accessPolicy, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, nil
	}
	var ids xmlSignedIdentifiers
	if err := xml.Unmarshal(body, &ids); err != nil {
		return nil, errInvalidXML
	}
	if len(ids.Identifiers) > maxPolicies {
		return nil, errInvalidXML
	}
	out := make([]accessPolicy, 0, len(ids.Identifiers))
	for _, id := range ids.Identifiers {
		if id.ID == "" || len(id.ID) > 64 {
			return nil, errInvalidXML
		}
		for _, c := range id.AccessPolicy.Permission {
			if !strings.ContainsRune("raup", c) {
				return nil, errInvalidXML
			}
		}
		for _, s := range []string{id.AccessPolicy.Start, id.AccessPolicy.Expiry} {
			if s != "" {
				if _, err := sharedkey.ParseSASTime(s); err != nil {
					return nil, errInvalidXML
				}
			}
		}
		out = append(out, accessPolicy{ID: id.ID, Start: id.AccessPolicy.Start, Expiry: id.AccessPolicy.Expiry, Permission: id.AccessPolicy.Permission})
	}
	return out, nil
}

func encodeACL(acl []accessPolicy) []byte {
	ids := xmlSignedIdentifiers{Identifiers: []xmlSignedIdentifier{}}
	for _, p := range acl {
		ids.Identifiers = append(ids.Identifiers, xmlSignedIdentifier{ID: p.ID,
			AccessPolicy: xmlAccessPolicy{Start: p.Start, Expiry: p.Expiry, Permission: p.Permission}})
	}
	return marshalXML(ids)
}

// innerXML is an element kept as it was sent.
type innerXML struct {
	Inner string `xml:",innerxml"`
}

// serviceProps are the queue service properties, each part as sent: the
// gateway keeps and returns them (it does not log, measure or apply
// CORS rules of its own).
type serviceProps struct {
	XMLName       xml.Name  `xml:"StorageServiceProperties"`
	Logging       *innerXML `xml:"Logging"`
	HourMetrics   *innerXML `xml:"HourMetrics"`
	MinuteMetrics *innerXML `xml:"MinuteMetrics"`
	Cors          *innerXML `xml:"Cors"`
}

func defaultServiceProps() *serviceProps {
	return &serviceProps{
		Logging:       &innerXML{"<Version>1.0</Version><Delete>false</Delete><Read>false</Read><Write>false</Write><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy>"},
		HourMetrics:   &innerXML{"<Version>1.0</Version><Enabled>false</Enabled><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy>"},
		MinuteMetrics: &innerXML{"<Version>1.0</Version><Enabled>false</Enabled><RetentionPolicy><Enabled>false</Enabled></RetentionPolicy>"},
		Cors:          &innerXML{},
	}
}

// decodeServiceProps reads a Set Queue Service Properties body.
func decodeServiceProps(body []byte) (*serviceProps, error) {
	var p serviceProps
	if err := xml.Unmarshal(body, &p); err != nil {
		return nil, errInvalidXML
	}
	return &p, nil
}

// merge keeps the parts set omits, as the service does.
func (p *serviceProps) merge(set *serviceProps) {
	if set.Logging != nil {
		p.Logging = set.Logging
	}
	if set.HourMetrics != nil {
		p.HourMetrics = set.HourMetrics
	}
	if set.MinuteMetrics != nil {
		p.MinuteMetrics = set.MinuteMetrics
	}
	if set.Cors != nil {
		p.Cors = set.Cors
	}
}

func marshalXML(v any) []byte {
	b, err := xml.Marshal(v)
	if err != nil {
		panic("queue: a response does not marshal: " + err.Error())
	}
	return append([]byte(xml.Header[:len(xml.Header)-1]), b...)
}

// Responses.

type xmlMetadata struct {
	Items []xmlMetaItem
}

type xmlMetaItem struct {
	XMLName xml.Name
	Value   string `xml:",chardata"`
}

func (m xmlMetadata) MarshalXML(e *xml.Encoder, start xml.StartElement) error {
	if err := e.EncodeToken(start); err != nil {
		return err
	}
	for _, it := range m.Items {
		if err := e.Encode(it); err != nil {
			return err
		}
	}
	return e.EncodeToken(start.End())
}

type xmlQueue struct {
	Name     string       `xml:"Name"`
	Metadata *xmlMetadata `xml:"Metadata,omitempty"`
}

type xmlQueueList struct {
	XMLName         xml.Name   `xml:"EnumerationResults"`
	ServiceEndpoint string     `xml:"ServiceEndpoint,attr"`
	Prefix          string     `xml:"Prefix,omitempty"`
	Marker          string     `xml:"Marker,omitempty"`
	MaxResults      int        `xml:"MaxResults,omitempty"`
	Queues          []xmlQueue `xml:"Queues>Queue"`
	NextMarker      string     `xml:"NextMarker"`
}

type xmlMessage struct {
	MessageID       string `xml:"MessageId"`
	InsertionTime   string `xml:"InsertionTime"`
	ExpirationTime  string `xml:"ExpirationTime"`
	PopReceipt      string `xml:"PopReceipt,omitempty"`
	TimeNextVisible string `xml:"TimeNextVisible,omitempty"`
	DequeueCount    *int   `xml:"DequeueCount,omitempty"`
	MessageText     *rawText
}

// rawText is character data escaped as the service escapes it: only &, <
// and > (Go's encoder also writes ' and " as &#39; and &#34;, which some
// SDKs' parsers hand back undecoded).
type rawText struct {
	Inner string `xml:",innerxml"`
}

func escapeText(s string) *rawText {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '&':
			b.WriteString("&amp;")
		case r == '<':
			b.WriteString("&lt;")
		case r == '>':
			b.WriteString("&gt;")
		case r == '\r':
			b.WriteString("&#xD;")
		case r == 0x09 || r == 0x0A || r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF:
			b.WriteRune(r)
		default:
			b.WriteRune(0xFFFD) // no XML character
		}
	}
	return &rawText{Inner: b.String()}
}

type xmlMessageList struct {
	XMLName  xml.Name     `xml:"QueueMessagesList"`
	Messages []xmlMessage `xml:"QueueMessage"`
}

// neverTime is how the service writes the expiry of a message that does
// not expire.
const neverTime = "Fri, 31 Dec 9999 23:59:59 GMT"

func httpTime(ms int64) string {
	if ms == never {
		return neverTime
	}
	return time.UnixMilli(ms).UTC().Format(http.TimeFormat)
}

// messageXML is m as an operation answers it: put (no text, no dequeue
// count), get (everything), peek (no receipt, no visibility).
func messageXML(m message, kind op) xmlMessage {
	x := xmlMessage{MessageID: formatID(m.ID), InsertionTime: httpTime(m.Rec.Inserted), ExpirationTime: httpTime(m.Rec.Expires)}
	if kind != opPeekMessages {
		x.PopReceipt, x.TimeNextVisible = m.Rec.Receipt, httpTime(m.Rec.Visible)
	}
	if kind != opPutMessage {
		n := int(m.Rec.Dequeues)
		x.DequeueCount, x.MessageText = &n, escapeText(m.Rec.Text)
	}
	return x
}

// formatID renders a message id as a UUID.
func formatID(id [16]byte) string {
	h := hex.EncodeToString(id[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// parseID reads a message id; ok is false when it is not one of ours
// (no such message).
func parseID(s string) (id [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, false
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	if _, err := hex.Decode(id[:], []byte(h)); err != nil {
		return id, false
	}
	return id, true
}

// intParam reads query parameter name as an integer in [lo, hi]; def
// when absent.
func intParam(q url.Values, name string, lo, hi, def int64) (int64, error) {
	s, ok := q[name]
	if !ok {
		return def, nil
	}
	v, err := strconv.ParseInt(s[0], 10, 64)
	if err != nil {
		return 0, errQueryValue(name, s[0], "not an integer")
	}
	if v < lo || v > hi {
		return 0, errQueryRange(name, s[0], lo, hi)
	}
	return v, nil
}

// putParams reads Put Message's visibilitytimeout and messagettl (-1:
// never expires; 0: never, as versions from 2017-07-29 allow).
func putParams(q url.Values) (visibility, ttl time.Duration, err error) {
	vis, err := intParam(q, "visibilitytimeout", 0, maxVisibility, 0)
	if err != nil {
		return 0, 0, err
	}
	t, err := intParam(q, "messagettl", -1, 1<<62, defaultTTL)
	if err != nil {
		return 0, 0, err
	}
	switch {
	case t == 0:
		return 0, 0, errQueryValue("messagettl", "0", "must be at least 1, or -1 for no expiry")
	case t > 0 && vis >= t:
		return 0, 0, errQueryValue("visibilitytimeout", strconv.FormatInt(vis, 10), "messagettl must be greater than visibilitytimeout")
	case t < 0 || t > maxTTL:
		t = 0 // never: the service caps expiry at 9999-12-31 too
	}
	return time.Duration(vis) * time.Second, time.Duration(t) * time.Second, nil
}

// validQueueName checks a queue name as the service does: 3 to 63
// characters, lower-case letters, digits and single hyphens, starting
// and ending with a letter or digit.
func validQueueName(name string) error {
	if name == "" {
		return errInvalidName
	}
	if len(name) < 3 || len(name) > 63 {
		return errNameLength
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case c == '-' && i > 0 && i < len(name)-1 && name[i-1] != '-':
		default:
			return errInvalidName
		}
	}
	return nil
}

// metadataOf reads the x-ms-meta-* headers. Names come lower-case: Go's
// server canonicalises header names, and the service compares them
// without regard to case.
func metadataOf(r *http.Request) []metaPair {
	var out []metaPair
	for n, vs := range r.Header {
		if m, ok := cutPrefixFold(n, "x-ms-meta-"); ok && m != "" {
			out = append(out, metaPair{Name: strings.ToLower(m), Value: strings.Join(vs, ",")})
		}
	}
	slices.SortFunc(out, func(a, b metaPair) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return "", false
}

// textSize is MessageText's size as the service counts it: its UTF-8
// bytes as sent.
func textSize(s string) int {
	if utf8.ValidString(s) {
		return len(s)
	}
	return len([]rune(s))
}
