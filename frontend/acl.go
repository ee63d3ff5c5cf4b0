package frontend

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// A table's ACL: up to five stored access policies (signed identifiers),
// each an id with an optional start, expiry and permissions, which a
// service SAS names with si. Removing a policy revokes every SAS naming
// it. XML body of Get and Set Table ACL:
//
//	<SignedIdentifiers>
//	  <SignedIdentifier><Id>id</Id>
//	    <AccessPolicy><Start>ISO 8601</Start><Expiry>ISO 8601</Expiry><Permission>raud</Permission></AccessPolicy>
//	  </SignedIdentifier>
//	</SignedIdentifiers>

const (
	maxSignedIdentifiers = 5
	maxSignedIDLen       = 64
	maxACLBody           = 64 << 10
)

// aclTimeLayout is how the service writes a policy's times.
const aclTimeLayout = "2006-01-02T15:04:05.0000000Z"

type signedIdentifiers struct {
	XMLName xml.Name           `xml:"SignedIdentifiers" json:"-"`
	IDs     []signedIdentifier `xml:"SignedIdentifier"`
}

type signedIdentifier struct {
	ID     string        `xml:"Id"`
	Policy *accessPolicy `xml:"AccessPolicy,omitempty" json:",omitempty"`
}

// accessPolicy's times are stored in aclTimeLayout; "" is unset.
type accessPolicy struct {
	Start      string `xml:"Start,omitempty" json:",omitempty"`
	Expiry     string `xml:"Expiry,omitempty" json:",omitempty"`
	Permission string `xml:"Permission,omitempty" json:",omitempty"`
}

// parseACL reads and validates a Set Table ACL body, normalising the
// times.
func parseACL(body []byte) ([]signedIdentifier, error) {
	if len(body) > maxACLBody {
		return nil, &svcError{status: http.StatusRequestEntityTooLarge, code: "RequestBodyTooLarge", msg: "The request body is too large."}
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, nil // an empty body clears the ACL
	}
	var s signedIdentifiers
	if err := xml.Unmarshal(body, &s); err != nil {
		return nil, errXMLDocument(err.Error())
	}
	if len(s.IDs) > maxSignedIdentifiers {
		return nil, errXMLDocument(fmt.Sprintf("%d signed identifiers; at most %d are allowed.", len(s.IDs), maxSignedIdentifiers))
	}
	seen := map[string]bool{}
	for i := range s.IDs {
		id := &s.IDs[i]
		if id.ID == "" || len(id.ID) > maxSignedIDLen {
			return nil, errXMLNode("SignedIdentifier/Id", fmt.Sprintf("Id %q: want 1 to %d characters.", id.ID, maxSignedIDLen))
		}
		if seen[id.ID] {
			return nil, errXMLNode("SignedIdentifier/Id", fmt.Sprintf("Id %q is given twice.", id.ID))
		}
		seen[id.ID] = true
		p := id.Policy
		if p == nil {
			continue
		}
		for _, f := range []struct {
			node string
			v    *string
		}{{"Start", &p.Start}, {"Expiry", &p.Expiry}} {
			if strings.TrimSpace(*f.v) == "" {
				*f.v = ""
				continue
			}
			t, err := parseACLTime(*f.v)
			if err != nil {
				return nil, errXMLNode("AccessPolicy/"+f.node, err.Error())
			}
			*f.v = t.Format(aclTimeLayout)
		}
		if err := checkTablePerms(p.Permission); err != nil {
			return nil, errXMLNode("AccessPolicy/Permission", err.Error())
		}
	}
	return s.IDs, nil
}

func parseACLTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	for _, l := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.9999999Z", "2006-01-02T15:04Z", "2006-01-02"} {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not an ISO 8601 UTC time", s)
}

// checkTablePerms checks a policy's permissions: letters from "raud",
// each at most once.
func checkTablePerms(p string) error {
	for i, c := range p {
		if !strings.ContainsRune("raud", c) {
			return fmt.Errorf("permission %q: unknown letter %q (want letters from raud)", p, c)
		}
		if strings.ContainsRune(p[:i], c) {
			return fmt.Errorf("permission %q repeats %q", p, c)
		}
	}
	return nil
}

// aclXML renders a table's ACL as the service sends it.
func aclXML(ids []signedIdentifier) []byte {
	var b bytes.Buffer
	b.WriteString(`<?xml version="1.0" encoding="utf-8"?>`)
	if err := xml.NewEncoder(&b).Encode(signedIdentifiers{IDs: ids}); err != nil {
		panic("frontend: encode signed identifiers: " + err.Error())
	}
	return b.Bytes()
}

// tableACL answers Get Table ACL.
func (q *request) tableACL(ctx context.Context, name string) {
	if err := q.p.Allows(sharedkey.OpGetTableACL, name, "", ""); err != nil {
		q.fail(err)
		return
	}
	if _, ok, err := q.acct.table(ctx, name); err != nil {
		q.fail(err)
		return
	} else if !ok {
		q.fail(errResourceNotFound)
		return
	}
	ids, err := q.acct.settings.acl(ctx, name)
	if err != nil {
		q.fail(err)
		return
	}
	q.writeXML(http.StatusOK, aclXML(ids))
}

// setTableACL answers Set Table ACL: the body replaces the table's
// policies, durably, before the 204; a policy left out is revoked.
func (q *request) setTableACL(ctx context.Context, name string) {
	if err := q.p.Allows(sharedkey.OpSetTableACL, name, "", ""); err != nil {
		q.fail(err)
		return
	}
	body, err := io.ReadAll(io.LimitReader(q.r.Body, maxACLBody+1))
	if err != nil {
		q.fail(err)
		return
	}
	ids, err := parseACL(body)
	if err != nil {
		q.fail(err)
		return
	}
	if _, ok, err := q.acct.tableFresh(ctx, name); err != nil {
		q.fail(err)
		return
	} else if !ok {
		q.fail(errResourceNotFound)
		return
	}
	if err := q.acct.settings.setACL(ctx, name, ids); err != nil {
		q.fail(err)
		return
	}
	q.w.Header().Set("Content-Length", "0")
	q.w.WriteHeader(http.StatusNoContent)
}

// requestKeys are the keys and stored access policies one request is
// verified against: the policies are read from the account's settings
// at once (no cache), so removing a policy revokes its SASes on every
// gateway immediately.
type requestKeys struct {
	ctx context.Context
	g   *Gateway
}

var _ sharedkey.Policies = requestKeys{}

// Lookup implements sharedkey.Keys.
func (k requestKeys) Lookup(account string) ([][]byte, bool) { return k.g.keys.Lookup(account) }

// Policy implements sharedkey.Policies.
func (k requestKeys) Policy(account, table, id string) (sharedkey.Policy, bool) {
	a, err := k.g.account(account)
	if err != nil {
		return sharedkey.Policy{}, false
	}
	ids, err := a.settings.acl(k.ctx, table)
	if err != nil {
		k.g.log.Warn("cannot read a table's stored access policies; refusing the SAS naming one", "account", account, "table", table, "err", err)
		return sharedkey.Policy{}, false
	}
	for _, si := range ids {
		if si.ID != id {
			continue
		}
		var p sharedkey.Policy
		if si.Policy != nil {
			p.Permissions = si.Policy.Permission
			p.Start, _ = parseACLTime(si.Policy.Start)
			p.Expiry, _ = parseACLTime(si.Policy.Expiry)
		}
		return p, true
	}
	return sharedkey.Policy{}, false
}
