package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend"
	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// azureListenUsage documents --azure-listen.
const azureListenUsage = "address of the Azure Table REST gateway (path-style: http://ADDR/ACCOUNT/Table; empty: off)"

// gatewayServer is a running Azure Table gateway.
type gatewayServer struct {
	gw   *frontend.Gateway
	lis  net.Listener
	srv  *http.Server
	done chan struct{}
	err  error
}

// startGateway serves the Azure Table gateway for the cluster at masters
// on addr, acting with the cluster credential cred.
func startGateway(ctx context.Context, addr string, masters []string, cred client.Credential, log *slog.Logger) (*gatewayServer, error) {
	gw, err := frontend.New(ctx, frontend.Options{Masters: masters, Credential: cred, Logger: log.With("part", "azure-gateway")})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("--azure-listen: %w", err), gw.Close())
	}
	s := &gatewayServer{gw: gw, lis: lis, done: make(chan struct{}),
		// The service keeps idle connections about two minutes.
		srv: &http.Server{Handler: gw, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	log.Info("serving the Azure Table gateway", "addr", lis.Addr().String())
	return s, nil
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
	var listen string
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve the Azure Table REST API for the cluster at --master",
		Long: `Serve the Azure Table REST API (path-style: http://ADDR/ACCOUNT/Table) over the cluster at
--master, so the Azure SDKs and tools work against it. Accounts are tenants: a request
signs with the tenant's key (Shared Key, Shared Key Lite, or a SAS made with it), and
an account's tables are its ordered tables. The gateway keeps no state: run several
behind a load balancer. It needs the cluster credential (--cluster-key) to read the
tenants' keys.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			cred, err := g.clusterCredential("", false)
			if err != nil {
				return err
			}
			gw, err := startGateway(cmd.Context(), listen, g.master, client.Credential(cred), log)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "azure   http://%s/ACCOUNT  (Azure Table REST, path-style)\ntabula gateway ready\n", gw.Addr())
			<-cmd.Context().Done()
			return gw.Close()
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:10002", azureListenUsage)
	return cmd
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
