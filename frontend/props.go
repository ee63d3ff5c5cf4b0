package frontend

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The Table service's properties (Get/Set Table Service Properties):
// Storage Analytics logging, hour and minute metrics, and CORS rules.
// The gateway stores and validates them as the service does; it keeps
// no analytics logs or metrics tables, so those settings are recorded
// and echoed only. CORS rules are applied (cors.go).
//
// XML body (every element optional on Set; an omitted one keeps its
// stored value):
//
//	<StorageServiceProperties>
//	  <Logging><Version/><Delete/><Read/><Write/><RetentionPolicy><Enabled/><Days/></RetentionPolicy></Logging>
//	  <HourMetrics><Version/><Enabled/><IncludeAPIs/><RetentionPolicy>...</RetentionPolicy></HourMetrics>
//	  <MinuteMetrics>...</MinuteMetrics>
//	  <Cors><CorsRule><AllowedOrigins/><AllowedMethods/><MaxAgeInSeconds/><ExposedHeaders/><AllowedHeaders/></CorsRule>...</Cors>
//	</StorageServiceProperties>

// Limits of the service's CORS rules.
const (
	maxCorsRules       = 5
	maxCorsValueLen    = 256 // an origin or a header name
	maxCorsLiteral     = 64  // literal headers in one list
	maxCorsPrefixed    = 2   // prefixed headers (ending in *) in one list
	maxRetentionDays   = 365
	maxServicePropBody = 64 << 10
)

// corsMethods are the methods a CORS rule may allow.
var corsMethods = []string{"DELETE", "GET", "HEAD", "MERGE", "POST", "OPTIONS", "PUT"}

// serviceProps are an account's service properties. Values are kept as
// the client spelled them after validation; booleans as "true"/"false".
// Pointers are elements that may be absent from a Set.
type serviceProps struct {
	XMLName       xml.Name   `xml:"StorageServiceProperties" json:"-"`
	Logging       *logging   `xml:"Logging" json:",omitempty"`
	HourMetrics   *metrics   `xml:"HourMetrics" json:",omitempty"`
	MinuteMetrics *metrics   `xml:"MinuteMetrics" json:",omitempty"`
	Cors          *corsRules `xml:"Cors" json:",omitempty"`
}

type logging struct {
	Version         string     `xml:"Version"`
	Delete          string     `xml:"Delete"`
	Read            string     `xml:"Read"`
	Write           string     `xml:"Write"`
	RetentionPolicy *retention `xml:"RetentionPolicy"`
}

type metrics struct {
	Version         string     `xml:"Version"`
	Enabled         string     `xml:"Enabled"`
	IncludeAPIs     string     `xml:"IncludeAPIs,omitempty" json:",omitempty"`
	RetentionPolicy *retention `xml:"RetentionPolicy"`
}

type retention struct {
	Enabled string `xml:"Enabled"`
	Days    string `xml:"Days,omitempty" json:",omitempty"`
}

type corsRules struct {
	Rules []corsRule `xml:"CorsRule"`
}

type corsRule struct {
	AllowedOrigins  string `xml:"AllowedOrigins"`
	AllowedMethods  string `xml:"AllowedMethods"`
	MaxAgeInSeconds string `xml:"MaxAgeInSeconds"`
	ExposedHeaders  string `xml:"ExposedHeaders"`
	AllowedHeaders  string `xml:"AllowedHeaders"`
}

// defaultServiceProps are an account's properties before any Set:
// nothing enabled, no CORS rules.
func defaultServiceProps() *serviceProps {
	p := &serviceProps{}
	p.fillDefaults()
	return p
}

// fillDefaults sets every absent element to its default.
func (p *serviceProps) fillDefaults() {
	off := func() *retention { return &retention{Enabled: "false"} }
	if p.Logging == nil {
		p.Logging = &logging{Version: "1.0", Delete: "false", Read: "false", Write: "false", RetentionPolicy: off()}
	}
	if p.HourMetrics == nil {
		p.HourMetrics = &metrics{Version: "1.0", Enabled: "false", RetentionPolicy: off()}
	}
	if p.MinuteMetrics == nil {
		p.MinuteMetrics = &metrics{Version: "1.0", Enabled: "false", RetentionPolicy: off()}
	}
	if p.Cors == nil {
		p.Cors = &corsRules{}
	}
}

// merge overwrites p's elements with those set has.
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

// xmlBody renders p as the service sends it.
func (p *serviceProps) xmlBody() []byte {
	var b bytes.Buffer
	b.WriteString(`<?xml version="1.0" encoding="utf-8"?>`)
	if err := xml.NewEncoder(&b).Encode(p); err != nil {
		// Strings only: encoding cannot fail.
		panic("frontend: encode service properties: " + err.Error())
	}
	return b.Bytes()
}

// errXMLNode is the service's answer to a well-formed body with a bad
// value; it names the node.
func errXMLNode(node, why string) error {
	return &svcError{status: http.StatusBadRequest, code: "InvalidXmlNodeValue",
		msg: fmt.Sprintf("The value for one of the XML nodes is not in the correct format. XmlNodeName: %s. %s", node, why)}
}

func errXMLDocument(why string) error {
	return &svcError{status: http.StatusBadRequest, code: "InvalidXmlDocument",
		msg: "XML specified is not syntactically valid. " + why}
}

// parseServiceProps reads and validates a Set Table Service Properties
// body.
func parseServiceProps(body []byte) (*serviceProps, error) {
	if len(body) > maxServicePropBody {
		return nil, &svcError{status: http.StatusRequestEntityTooLarge, code: "RequestBodyTooLarge", msg: "The request body is too large."}
	}
	p := &serviceProps{}
	if err := xml.Unmarshal(body, p); err != nil {
		return nil, errXMLDocument(err.Error())
	}
	if l := p.Logging; l != nil {
		if err := checkVersion("Logging", l.Version); err != nil {
			return nil, err
		}
		for _, f := range []struct{ node, v string }{{"Delete", l.Delete}, {"Read", l.Read}, {"Write", l.Write}} {
			if _, err := parseXMLBool("Logging/"+f.node, f.v); err != nil {
				return nil, err
			}
		}
		if err := checkRetention("Logging", l.RetentionPolicy); err != nil {
			return nil, err
		}
	}
	for _, m := range []struct {
		node string
		m    *metrics
	}{{"HourMetrics", p.HourMetrics}, {"MinuteMetrics", p.MinuteMetrics}} {
		if m.m == nil {
			continue
		}
		if err := checkVersion(m.node, m.m.Version); err != nil {
			return nil, err
		}
		on, err := parseXMLBool(m.node+"/Enabled", m.m.Enabled)
		if err != nil {
			return nil, err
		}
		switch {
		case on && m.m.IncludeAPIs == "":
			return nil, errXMLNode(m.node+"/IncludeAPIs", "IncludeAPIs is required when metrics are enabled.")
		case m.m.IncludeAPIs != "":
			if _, err := parseXMLBool(m.node+"/IncludeAPIs", m.m.IncludeAPIs); err != nil {
				return nil, err
			}
		}
		if err := checkRetention(m.node, m.m.RetentionPolicy); err != nil {
			return nil, err
		}
	}
	if c := p.Cors; c != nil {
		if len(c.Rules) > maxCorsRules {
			return nil, errXMLNode("Cors", fmt.Sprintf("%d CORS rules; at most %d are allowed.", len(c.Rules), maxCorsRules))
		}
		for i := range c.Rules {
			if err := checkCorsRule(&c.Rules[i]); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

func checkVersion(node, v string) error {
	if v != "1.0" {
		return errXMLNode(node+"/Version", fmt.Sprintf("Version %q: want 1.0.", v))
	}
	return nil
}

func parseXMLBool(node, v string) (bool, error) {
	switch strings.TrimSpace(v) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, errXMLNode(node, fmt.Sprintf("%q is not true or false.", v))
}

func checkRetention(node string, r *retention) error {
	node += "/RetentionPolicy"
	if r == nil {
		return errXMLNode(node, "RetentionPolicy is required.")
	}
	on, err := parseXMLBool(node+"/Enabled", r.Enabled)
	if err != nil {
		return err
	}
	if !on {
		if r.Days != "" {
			return errXMLNode(node+"/Days", "Days is given with retention disabled.")
		}
		return nil
	}
	d, err := strconv.Atoi(strings.TrimSpace(r.Days))
	if err != nil || d < 1 || d > maxRetentionDays {
		return errXMLNode(node+"/Days", fmt.Sprintf("Days %q: want 1 to %d.", r.Days, maxRetentionDays))
	}
	return nil
}

// splitList splits a comma-separated CORS list, trimming spaces; "" is
// no item.
func splitList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

func checkCorsRule(r *corsRule) error {
	origins := splitList(r.AllowedOrigins)
	if len(origins) == 0 {
		return errXMLNode("CorsRule/AllowedOrigins", "AllowedOrigins is required.")
	}
	for _, o := range origins {
		if o == "" || len(o) > maxCorsValueLen {
			return errXMLNode("CorsRule/AllowedOrigins", fmt.Sprintf("origin %q: want 1 to %d characters.", o, maxCorsValueLen))
		}
	}
	methods := splitList(r.AllowedMethods)
	if len(methods) == 0 {
		return errXMLNode("CorsRule/AllowedMethods", "AllowedMethods is required.")
	}
	for _, m := range methods {
		if !slices.Contains(corsMethods, m) {
			return errXMLNode("CorsRule/AllowedMethods", fmt.Sprintf("method %q: want one of %s.", m, strings.Join(corsMethods, ", ")))
		}
	}
	if age, err := strconv.Atoi(strings.TrimSpace(r.MaxAgeInSeconds)); err != nil || age < 0 {
		return errXMLNode("CorsRule/MaxAgeInSeconds", fmt.Sprintf("MaxAgeInSeconds %q: want a non-negative integer.", r.MaxAgeInSeconds))
	}
	for _, h := range []struct{ node, v string }{{"AllowedHeaders", r.AllowedHeaders}, {"ExposedHeaders", r.ExposedHeaders}} {
		literal, prefixed := 0, 0
		for _, name := range splitList(h.v) {
			if name == "" || len(name) > maxCorsValueLen {
				return errXMLNode("CorsRule/"+h.node, fmt.Sprintf("header %q: want 1 to %d characters.", name, maxCorsValueLen))
			}
			if strings.HasSuffix(name, "*") {
				prefixed++
			} else {
				literal++
			}
		}
		if literal > maxCorsLiteral || prefixed > maxCorsPrefixed {
			return errXMLNode("CorsRule/"+h.node, fmt.Sprintf("%d literal and %d prefixed headers; at most %d and %d.", literal, prefixed, maxCorsLiteral, maxCorsPrefixed))
		}
	}
	return nil
}
