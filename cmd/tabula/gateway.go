package main

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend"
	"github.com/tabuladb/tabula/frontend/bearer"
	"github.com/tabuladb/tabula/frontend/queue"
	"github.com/tabuladb/tabula/frontend/sharedkey"
	"github.com/tabuladb/tabula/internal/tlsfiles"
)

// azureListenUsage documents --azure-listen.
const azureListenUsage = "address of the Azure Table REST gateway (path-style: http://ADDR/ACCOUNT/Table; empty: off)"

// queueListenUsage documents --queue-listen.
const queueListenUsage = "address of the Azure Queue REST service (path-style: http://ADDR/ACCOUNT/queue; empty: off)"

// queueServer is a running Azure Queue service.
type queueServer struct {
	qs   *queue.Server
	lis  net.Listener
	tls  bool
	srv  *http.Server
	done chan struct{}
	err  error
}

// startQueue serves the Azure Queue service for the cluster at
// cfg.masters on cfg.addr, acting with the cluster credential (cfg.bearer
// is not used: the queue service takes no bearer tokens).
func startQueue(ctx context.Context, cfg gatewayConfig) (*queueServer, error) {
	log := cfg.log
	qs, err := queue.New(ctx, queue.Options{Masters: cfg.masters, Credential: cfg.cred, TLS: cfg.dialTLS, Logger: log.With("part", "azure-queue")})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("--queue-listen: %w", err), qs.Close())
	}
	s := &queueServer{qs: qs, lis: lis, tls: cfg.serve != nil, done: make(chan struct{}),
		srv: &http.Server{Handler: qs, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, TLSConfig: cfg.serve}}
	go func() {
		defer close(s.done)
		var err error
		if cfg.serve != nil {
			err = s.srv.ServeTLS(lis, "", "")
		} else {
			err = s.srv.Serve(lis)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	log.Info("serving the Azure Queue service", "addr", lis.Addr().String(), "tls", cfg.serve != nil)
	return s, nil
}

// URL is the queue service's base URL.
func (s *queueServer) URL() string {
	if s.tls {
		return "https://" + s.lis.Addr().String()
	}
	return "http://" + s.lis.Addr().String()
}

// Close stops serving (requests in flight get 5 s) and closes the
// service. Nil-safe.
func (s *queueServer) Close() error {
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return errors.Join(err, s.err, s.qs.Close())
}

// gatewayServer is a running Azure Table gateway.
type gatewayServer struct {
	gw   *frontend.Gateway
	lis  net.Listener
	tls  bool // serves HTTPS
	srv  *http.Server
	done chan struct{}
	err  error
}

// gatewayTLS are the --azure-tls-cert and --azure-tls-key flags of
// tabula dev and tabula gateway: the certificate the gateway serves
// HTTPS with.
type gatewayTLS struct{ cert, key string }

func (t *gatewayTLS) register(fs *pflag.FlagSet) {
	fs.StringVar(&t.cert, "azure-tls-cert", "", "PEM certificate chain the Azure Table gateway serves HTTPS with (with --azure-tls-key; default: plaintext HTTP)")
	fs.StringVar(&t.key, "azure-tls-key", "", "PEM private key of --azure-tls-cert")
}

// config loads the pair; nil when neither flag is given.
func (t gatewayTLS) config() (*tls.Config, error) {
	if t.cert == "" && t.key == "" {
		return nil, nil
	}
	if t.cert == "" || t.key == "" {
		return nil, fmt.Errorf("--azure-tls-cert and --azure-tls-key go together (got %q and %q)", t.cert, t.key)
	}
	cert, err := tls.LoadX509KeyPair(t.cert, t.key)
	if err != nil {
		return nil, fmt.Errorf("--azure-tls-cert/--azure-tls-key: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// gatewayConfig is what startGateway needs.
type gatewayConfig struct {
	addr    string
	masters []string
	cred    client.Credential
	dialTLS *tls.Config // dials the cluster over TLS when set
	serve   *tls.Config // serves HTTPS when set, else plaintext HTTP
	bearer  *bearer.Verifier
	log     *slog.Logger
}

// startGateway serves the Azure Table gateway for the cluster at
// cfg.masters on cfg.addr, acting with the cluster credential.
func startGateway(ctx context.Context, cfg gatewayConfig) (*gatewayServer, error) {
	log := cfg.log
	gw, err := frontend.New(ctx, frontend.Options{Masters: cfg.masters, Credential: cfg.cred, TLS: cfg.dialTLS, Bearer: cfg.bearer, Logger: log.With("part", "azure-gateway")})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("--azure-listen: %w", err), gw.Close())
	}
	s := &gatewayServer{gw: gw, lis: lis, tls: cfg.serve != nil, done: make(chan struct{}),
		// The service keeps idle connections about two minutes.
		srv: &http.Server{Handler: gw, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, TLSConfig: cfg.serve}}
	go func() {
		defer close(s.done)
		var err error
		if cfg.serve != nil {
			err = s.srv.ServeTLS(lis, "", "")
		} else {
			err = s.srv.Serve(lis)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	log.Info("serving the Azure Table gateway", "addr", lis.Addr().String(), "tls", cfg.serve != nil)
	return s, nil
}

// URL is the gateway's base URL: http:// or https:// and the address.
func (s *gatewayServer) URL() string {
	if s.tls {
		return "https://" + s.Addr()
	}
	return "http://" + s.Addr()
}

// Addr is the gateway's listening address.
func (s *gatewayServer) Addr() string { return s.lis.Addr().String() }

// Close stops serving (requests in flight get 5 s) and closes the
// gateway.
func (s *gatewayServer) Close() error {
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return errors.Join(err, s.err, s.gw.Close())
}

func gatewayCmd(g *globals) *cobra.Command {
	var (
		listen      string
		queueListen string
		azTLS       gatewayTLS
		oauthKeys   string
	)
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve the Azure Table REST API for the cluster at --master",
		Long: `Serve the Azure Table REST API (path-style: http://ADDR/ACCOUNT/Table) over the cluster at
--master, so the Azure SDKs and tools work against it. Accounts are tenants: a request
signs with the tenant's key (Shared Key, Shared Key Lite, or a SAS made with it), and
an account's tables are its ordered tables. The gateway keeps no state of its own (an
account's service properties and stored access policies are records of its tenant): run
several behind a load balancer. It needs the cluster credential (--cluster-key) to read
the tenants' keys.

HTTPS: --azure-tls-cert and --azure-tls-key. With the cluster's --tls-cert and --tls-key
and no --azure-tls-*, the gateway serves HTTPS with the cluster's pair; with only
--tls-ca it refuses to start rather than serve plaintext beside a TLS cluster.

OAuth: --azure-oauth-keys FILE accepts "Authorization: Bearer <JWT>" over HTTPS, signed
(RS256 or ES256) by a key of FILE, from one of its issuers, for the storage audience or
the account's URL, its principal (oid) granted the account as reader or contributor:
{"issuers": [...], "keys": [{"kid": "...", "pem": "..."}], "grants": [{"principal": "...", "account": "...", "role": "reader"}]}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			serve, dial, err := gatewayTLSConfigs(azTLS, g.tls)
			if err != nil {
				return err
			}
			var bv *bearer.Verifier
			if oauthKeys != "" {
				if serve == nil {
					return errors.New("tabula gateway: --azure-oauth-keys needs HTTPS (bearer tokens are refused over HTTP): give --azure-tls-cert and --azure-tls-key")
				}
				if bv, err = bearer.LoadFile(oauthKeys); err != nil {
					return err
				}
			}
			cred, err := g.clusterCredential("", false)
			if err != nil {
				return err
			}
			gw, err := startGateway(cmd.Context(), gatewayConfig{addr: listen, masters: g.master, cred: client.Credential(cred),
				dialTLS: dial, serve: serve, bearer: bv, log: log})
			if err != nil {
				return err
			}
			var qsrv *queueServer
			if queueListen != "" {
				if qsrv, err = startQueue(cmd.Context(), gatewayConfig{addr: queueListen, masters: g.master, cred: client.Credential(cred),
					dialTLS: dial, serve: serve, log: log}); err != nil {
					return errors.Join(err, gw.Close())
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "azure   %s/ACCOUNT  (Azure Table REST, path-style)\n", gw.URL())
			if qsrv != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "queue   %s/ACCOUNT  (Azure Queue REST, path-style)\n", qsrv.URL())
			}
			fmt.Fprintln(cmd.OutOrStdout(), "tabula gateway ready")
			<-cmd.Context().Done()
			return errors.Join(qsrv.Close(), gw.Close())
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:10002", azureListenUsage)
	cmd.Flags().StringVar(&queueListen, "queue-listen", "", queueListenUsage+" (default: off)")
	azTLS.register(cmd.Flags())
	cmd.Flags().StringVar(&oauthKeys, "azure-oauth-keys", "", "JSON file of the issuers, public keys (PEM) and principal-to-account grants that OAuth bearer tokens are verified with (default: bearer tokens refused)")
	return cmd
}

// errGatewayPlaintext refuses a plaintext gateway beside a TLS cluster.
var errGatewayPlaintext = errors.New("tabula gateway: the cluster is reached over TLS (--tls-ca) but the gateway has no certificate to serve HTTPS with; " +
	"give --azure-tls-cert and --azure-tls-key (or the cluster's --tls-cert and --tls-key)")

// gatewayTLSConfigs resolves what the gateway serves with and dials the
// cluster with: never plaintext beside a TLS cluster without saying so.
func gatewayTLSConfigs(az gatewayTLS, cluster tlsfiles.Files) (serve, dial *tls.Config, err error) {
	if serve, err = az.config(); err != nil {
		return nil, nil, err
	}
	if !cluster.Enabled() {
		return serve, nil, nil
	}
	if dial, err = cluster.Client(); err != nil {
		return nil, nil, err
	}
	if serve == nil {
		if cluster.Cert == "" || cluster.Key == "" {
			return nil, nil, errGatewayPlaintext
		}
		if serve, err = cluster.Server(); err != nil {
			return nil, nil, err
		}
	}
	return serve, dial, nil
}

// ensureDevAccount makes sure the development account exists as a tenant
// with the Azure emulator's well-known key, so UseDevelopmentStorage=true
// connection strings work against tabula dev.
func ensureDevAccount(ctx context.Context, masters []string, cred client.Credential) error {
	key, err := base64.StdEncoding.DecodeString(sharedkey.DevKey)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := client.New(ctx, client.Options{Masters: masters, Credential: cred})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.CreateTenant(ctx, sharedkey.DevAccount, nil, key)
	if api.CodeOf(err) == api.ErrorCode_ERROR_CODE_ALREADY_EXISTS {
		return nil
	}
	return err
}
