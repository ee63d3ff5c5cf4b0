package client

import (
	"google.golang.org/grpc"

	"fmt"

	"github.com/tabuladb/tabula/internal/auth"
)

// ClusterPrincipal is the principal of the cluster credential (the
// operator's and the cluster processes'), which may act for any tenant.
const ClusterPrincipal = auth.ClusterPrincipal

// KeyBytes is the length of every key: 512 bits.
const KeyBytes = auth.KeyBytes

// Credential signs a client's requests (HMAC-SHA256, see Options). A
// tenant's credential is its name, the number of the key (1 or 2) and the
// key; the cluster credential is ClusterPrincipal, key number 0 and the
// cluster key. The zero Credential signs nothing, which only a cluster
// running without authentication (in-process tests) accepts.
type Credential struct {
	Principal string
	KeyID     int
	Key       []byte
}

// TenantCredential is tenant's key number id (1 or 2).
func TenantCredential(tenant string, id int, key []byte) Credential {
	return Credential{Principal: tenant, KeyID: id, Key: key}
}

// ClusterCredential is the cluster credential with key.
func ClusterCredential(key []byte) Credential {
	return Credential{Principal: ClusterPrincipal, Key: key}
}

// ReadCredentialFile reads a credential file (the cluster credential
// `tabula dev` and `tabula master` write, or one `tabula tenant create
// --save` wrote).
func ReadCredentialFile(path string) (Credential, error) {
	c, err := auth.ReadCredentialFile(path)
	if err != nil {
		return Credential{}, fmt.Errorf("client: %w", err)
	}
	return Credential(c), nil
}

// DecodeKey parses a key as the CLI prints it (base64).
func DecodeKey(s string) ([]byte, error) { return auth.DecodeKey(s) }

// EncodeKey renders a key as the CLI prints it.
func EncodeKey(k []byte) string { return auth.EncodeKey(k) }

func (c Credential) zero() bool { return c.Principal == "" && c.Key == nil }

func (c Credential) auth() auth.Credential { return auth.Credential(c) }

// DialOptions sign every call made over a connection with c: for callers
// that use the api package's stubs directly. None for the zero Credential.
func (c Credential) DialOptions() []grpc.DialOption { return c.auth().DialOptions() }
