package tlsfiles_test

import (
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tabuladb/tabula/internal/tlsfiles"
	"github.com/tabuladb/tabula/internal/tlsfiles/tlsfilestest"
)

// TestFiles: the zero value is TLS off; a certificate without its key
// is refused; a CA file without a certificate is refused; a server and a
// client built from the files complete a handshake, and a client that
// trusts another CA does not.
func TestFiles(t *testing.T) {
	if cfg, err := (tlsfiles.Files{}).Server(); cfg != nil || err != nil {
		t.Fatalf("zero Files: %v %v, want TLS off", cfg, err)
	}
	dir := t.TempDir()
	f := tlsfilestest.Write(t, dir)
	if _, err := (tlsfiles.Files{Cert: f.Cert}).Server(); !errors.Is(err, tlsfiles.ErrNoCertificate) {
		t.Fatalf("cert without key: %v", err)
	}
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (tlsfiles.Files{CA: bad}).Client(); err == nil {
		t.Fatal("a CA file with no certificate was accepted")
	}
	srv, err := f.Server()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := f.Client()
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), cli)
	if err != nil {
		t.Fatalf("handshake with the cluster's CA: %v", err)
	}
	c.Close()
	other := tlsfilestest.Write(t, t.TempDir())
	ocli, err := (tlsfiles.Files{CA: other.CA}).Client()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := tls.Dial("tcp", lis.Addr().String(), ocli); err == nil {
		c.Close()
		t.Fatal("a client trusting another CA completed the handshake")
	}
}
