// Package bearer checks OAuth 2.0 bearer tokens (JWTs) as Azure Storage
// does for the Table service: "Authorization: Bearer <JWT>" over HTTPS,
// with an audience of the storage resource (https://storage.azure.com,
// its application id, or the account's URL), an issuer, and a lifetime
// (nbf, exp). A Verifier maps the token's principal to an account and a
// role.
//
// Two modes:
//
//   - Dev: as Azurite's "--oauth basic": no signature check; the issuer
//     must be one of Azure AD's token services, the audience the storage
//     resource or the account's URL, the lifetime current. The principal
//     may use the account the request addresses, as a contributor. For
//     tabula dev only.
//   - Production: the signature (RS256 or ES256) must verify with one of
//     the operator's keys (a key file), the issuer must be one the file
//     names, and the token's oid (or sub) must be mapped by the file to
//     the account it addresses, with a role.
//
// A token is three base64url parts, header.payload.signature; the first
// two are JSON (RFC 7519).
package bearer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"regexp"
	"strings"
	"time"
)

// MaxTokenLen bounds a token: Azure AD tokens are a few KiB.
const MaxTokenLen = 16 << 10

// Claims are the claims a token is checked by.
type Claims struct {
	Audience  audience `json:"aud"`
	Issuer    string   `json:"iss"`
	NotBefore *float64 `json:"nbf"`
	Expiry    *float64 `json:"exp"`
	IssuedAt  *float64 `json:"iat"`
	ObjectID  string   `json:"oid"`
	Subject   string   `json:"sub"`
	TenantID  string   `json:"tid"`
}

// audience is aud: a string or an array of strings (RFC 7519 4.1.3).
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*a = audience{s}
		return nil
	}
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return errors.New("aud is neither a string nor an array of strings")
	}
	*a = l
	return nil
}

// Token is a parsed, unverified JWT.
type Token struct {
	Alg, Kid     string
	Claims       Claims
	signingInput string
	signature    []byte
}

// ErrMalformed is the cause of a token that is not a JWT.
var ErrMalformed = errors.New("bearer: not a JWT")

// Parse reads a JWT's form. It says nothing of its validity.
func Parse(tok string) (*Token, error) {
	if len(tok) > MaxTokenLen {
		return nil, fmt.Errorf("%w: %d bytes, over %d", ErrMalformed, len(tok), MaxTokenLen)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("%w: %d parts, want 3", ErrMalformed, len(parts))
	}
	dec := func(what, s string) ([]byte, error) {
		b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
		if err != nil {
			return nil, fmt.Errorf("%w: %s is not base64url: %v", ErrMalformed, what, err)
		}
		return b, nil
	}
	hb, err := dec("header", parts[0])
	if err != nil {
		return nil, err
	}
	pb, err := dec("payload", parts[1])
	if err != nil {
		return nil, err
	}
	sig, err := dec("signature", parts[2])
	if err != nil {
		return nil, err
	}
	var h struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(hb, &h); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrMalformed, err)
	}
	t := &Token{Alg: h.Alg, Kid: h.Kid, signingInput: parts[0] + "." + parts[1], signature: sig}
	if err := json.Unmarshal(pb, &t.Claims); err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrMalformed, err)
	}
	return t, nil
}

// Error is a refused token: Detail names what failed, in the words
// Azure Storage (and Azurite) use.
type Error struct {
	Detail string
}

func (e *Error) Error() string { return "bearer: " + e.Detail }

func refuse(format string, args ...any) error { return &Error{Detail: fmt.Sprintf(format, args...)} }

// The service's words for each failure.
const (
	DetailUnsupported = "Authentication scheme Bearer is not supported."
	DetailNotYet      = "Lifetime validation failed. The token is not yet valid (nbf)."
	DetailExpired     = "Lifetime validation failed. The token is expired."
	DetailIssuer      = "Invalid token issuer."
	DetailAudience    = "Invalid token audience."
	DetailSignature   = "Signature validation failed."
	DetailPrincipal   = "The token's principal is not granted access to this account."
)

// Role is what a principal may do in an account.
type Role uint8

const (
	// RoleReader reads tables and entities (Storage Table Data Reader).
	RoleReader Role = iota + 1
	// RoleContributor reads and writes (Storage Table Data Contributor).
	RoleContributor
)

// azureIssuers are Azure AD's token services (as Azurite's basic mode
// accepts them).
var azureIssuers = []string{"https://sts.windows.net/", "https://sts.microsoftonline.de/", "https://sts.chinacloudapi.cn/", "https://sts.windows-ppe.net"}

// storageAudiences are the audiences of the storage resource; (.*) is
// the account.
var storageAudiences = []*regexp.Regexp{
	regexp.MustCompile(`^https://storage\.azure\.com/?$`),
	regexp.MustCompile(`^e406a681-f3d4-42a8-90b6-c2b029497af1$`),
	regexp.MustCompile(`^https://([^/]*)\.table\.core\.windows\.net/?$`),
	regexp.MustCompile(`^https://([^/]*)\.table\.core\.chinacloudapi\.cn/?$`),
	regexp.MustCompile(`^https://([^/]*)\.table\.core\.usgovcloudapi\.net/?$`),
	regexp.MustCompile(`^https://([^/]*)\.table\.core\.cloudapi\.de/?$`),
}

// audienceOK says whether one of aud names the storage resource for
// account, or is accountURL (the URL the request addressed the account
// by, scheme://host/account).
func audienceOK(aud []string, account, accountURL string) bool {
	for _, a := range aud {
		if accountURL != "" && strings.TrimSuffix(a, "/") == accountURL {
			return true
		}
		for _, re := range storageAudiences {
			if m := re.FindStringSubmatch(a); m != nil && (len(m) < 2 || m[1] == account) {
				return true
			}
		}
	}
	return false
}

// Grant maps a principal to an account and a role.
type Grant struct {
	Principal string `json:"principal"` // the token's oid, else its sub
	Account   string `json:"account"`
	Role      string `json:"role"` // "reader" or "contributor"
}

// Config is a production verifier's key file (JSON):
//
//	{"issuers": ["https://sts.windows.net/<tenant id>/"],
//	 "keys": [{"kid": "optional key id", "pem": "-----BEGIN PUBLIC KEY-----..."}],
//	 "grants": [{"principal": "<oid>", "account": "acct", "role": "contributor"}]}
type Config struct {
	Issuers []string `json:"issuers"`
	Keys    []struct {
		Kid string `json:"kid"`
		PEM string `json:"pem"`
	} `json:"keys"`
	Grants []Grant `json:"grants"`
}

type key struct {
	kid string
	pub crypto.PublicKey
}

// Verifier checks tokens. Immutable once made: safe for concurrent use.
type Verifier struct {
	dev     bool
	issuers []string
	keys    []key
	grants  map[string]map[string]Role // principal -> account -> role
}

// Dev is the development verifier (see the package comment).
func Dev() *Verifier { return &Verifier{dev: true} }

// LoadFile reads a production verifier's key file.
func LoadFile(path string) (*Verifier, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bearer: read the key file: %w", err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("bearer: key file %s: %w", path, err)
	}
	v, err := New(c)
	if err != nil {
		return nil, fmt.Errorf("bearer: key file %s: %w", path, err)
	}
	return v, nil
}

// New makes a production verifier from c.
func New(c Config) (*Verifier, error) {
	if len(c.Issuers) == 0 || len(c.Keys) == 0 {
		return nil, errors.New("needs at least one issuer and one key")
	}
	v := &Verifier{issuers: c.Issuers, grants: map[string]map[string]Role{}}
	for i, k := range c.Keys {
		blk, _ := pem.Decode([]byte(k.PEM))
		if blk == nil {
			return nil, fmt.Errorf("key %d: no PEM block", i)
		}
		pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			cert, cerr := x509.ParseCertificate(blk.Bytes)
			if cerr != nil {
				return nil, fmt.Errorf("key %d: neither a public key (%v) nor a certificate (%v)", i, err, cerr)
			}
			pub = cert.PublicKey
		}
		switch pub.(type) {
		case *rsa.PublicKey, *ecdsa.PublicKey:
		default:
			return nil, fmt.Errorf("key %d: %T keys are not supported (RSA or ECDSA P-256)", i, pub)
		}
		v.keys = append(v.keys, key{kid: k.Kid, pub: pub})
	}
	for _, g := range c.Grants {
		var r Role
		switch strings.ToLower(g.Role) {
		case "reader":
			r = RoleReader
		case "contributor":
			r = RoleContributor
		default:
			return nil, fmt.Errorf("grant of %q: role %q: want reader or contributor", g.Principal, g.Role)
		}
		if g.Principal == "" || g.Account == "" {
			return nil, errors.New("a grant needs a principal and an account")
		}
		if v.grants[g.Principal] == nil {
			v.grants[g.Principal] = map[string]Role{}
		}
		v.grants[g.Principal][g.Account] = r
	}
	return v, nil
}

// Verify checks tok for a request to account (addressed as accountURL)
// at now, and returns the principal's role there, or an *Error naming
// the failing check.
func (v *Verifier) Verify(tok, account, accountURL string, now time.Time) (Role, error) {
	t, err := Parse(tok)
	if err != nil {
		return 0, refuse(DetailUnsupported)
	}
	c := t.Claims
	if !v.dev {
		if err := v.checkSignature(t); err != nil {
			return 0, err
		}
	}
	if c.NotBefore == nil || c.Expiry == nil || (v.dev && c.IssuedAt == nil) {
		return 0, refuse(DetailUnsupported)
	}
	secs := float64(now.UnixMilli()) / 1000
	if secs < *c.NotBefore {
		return 0, refuse(DetailNotYet)
	}
	if secs > *c.Expiry {
		return 0, refuse(DetailExpired)
	}
	if c.Issuer == "" {
		return 0, refuse(DetailUnsupported)
	}
	issuers := v.issuers
	prefix := false
	if v.dev {
		issuers, prefix = azureIssuers, true
	}
	ok := false
	for _, i := range issuers {
		if c.Issuer == i || prefix && strings.HasPrefix(c.Issuer, i) {
			ok = true
		}
	}
	if !ok {
		return 0, refuse(DetailIssuer)
	}
	if len(c.Audience) == 0 {
		return 0, refuse(DetailUnsupported)
	}
	if !audienceOK(c.Audience, account, accountURL) {
		return 0, refuse(DetailAudience)
	}
	if v.dev {
		return RoleContributor, nil
	}
	who := c.ObjectID
	if who == "" {
		who = c.Subject
	}
	if r, ok := v.grants[who][account]; ok {
		return r, nil
	}
	return 0, refuse(DetailPrincipal)
}

// checkSignature verifies t with the key its kid names (any key when it
// names none).
func (v *Verifier) checkSignature(t *Token) error {
	sum := sha256.Sum256([]byte(t.signingInput))
	for _, k := range v.keys {
		if t.Kid != "" && k.kid != "" && k.kid != t.Kid {
			continue
		}
		switch pub := k.pub.(type) {
		case *rsa.PublicKey:
			if t.Alg == "RS256" && rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], t.signature) == nil {
				return nil
			}
		case *ecdsa.PublicKey:
			// JWS ES256 signatures are r||s, 32 bytes each.
			if t.Alg == "ES256" && len(t.signature) == 64 {
				r, s := new(big.Int).SetBytes(t.signature[:32]), new(big.Int).SetBytes(t.signature[32:])
				if ecdsa.Verify(pub, sum[:], r, s) {
					return nil
				}
			}
		}
	}
	return refuse(DetailSignature)
}
