package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ErrNoCertificate: serving TLS needs both a certificate and its key.
var ErrNoCertificate = errors.New("tlsfiles: --tls-cert and --tls-key go together")

// Files names the PEM files. The zero value is TLS off.
type Files struct {
	Cert string // the certificate chain this process serves with
	Key  string // its private key
	CA   string // certificate authorities to trust when dialing (empty: the system's)
}

// Enabled reports whether any file is named: then every listener serves
// TLS (with Cert and Key) and every dial verifies the peer.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Server returns the configuration to serve with, nil when TLS is off.
func (f Files) Server() (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	if f.Cert == "" || f.Key == "" {
		return nil, fmt.Errorf("%w: serving TLS needs both (got --tls-cert %q, --tls-key %q)", ErrNoCertificate, f.Cert, f.Key)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("tlsfiles: load %s and %s: %w", f.Cert, f.Key, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// Client returns the configuration to dial with, nil when TLS is off.
func (f Files) Client() (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("tlsfiles: read the CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tlsfiles: %s holds no PEM certificate", f.CA)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// ServerOption is the gRPC server option that serves cfg (none for nil).
func ServerOption(cfg *tls.Config) []grpc.ServerOption {
	if cfg == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(cfg))}
}

// DialOption is the gRPC dial option that dials with cfg (none for nil:
// the caller's plaintext default stands). Given after a plaintext
// option, it replaces it.
func DialOption(cfg *tls.Config) []grpc.DialOption {
	if cfg == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
}
