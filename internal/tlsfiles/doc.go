// Package tlsfiles turns the PEM files an operator names (--tls-cert,
// --tls-key, --tls-ca) into the TLS configurations of Tabula's processes:
// the server side (a certificate and its key, served on every listener)
// and the client side (the certificate authorities a process or the CLI
// trusts when it dials; the system's when none is named).
//
// Requests are signed whether or not TLS is on (internal/auth); TLS adds
// confidentiality and server authentication on the wire.
//
// Concurrency: Files is a value; the configurations it returns are the
// caller's.
package tlsfiles
