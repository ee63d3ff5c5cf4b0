package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend/bearer"
	"github.com/tabuladb/tabula/frontend/sharedkey"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tableserver"
)

func devCmd(g *globals) *cobra.Command {
	var (
		dir     string
		listen  string
		servers int
		masters int

		metricsListen string
		debug         string
		dashListen    string
		azureListen   string
		queueListen   string
		azTLS         gatewayTLS
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an embedded cluster: 1 master and 3 table servers in one process",
		Long: `Run a whole cluster in one process for development: a Table Master on --listen and
--servers table servers on free 127.0.0.1 ports, with data under --data. With --masters 3
(or 5) the master is a raft group: member N on the --listen port + N-1. It
prints the endpoints and "tabula dev ready" once it serves, and runs until interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.tls.Cert != "" || g.tls.Key != "" {
				return fmt.Errorf("tabula dev serves plaintext on loopback; for TLS start tabula master and tabula server with --tls-cert, --tls-key and --tls-ca")
			}
			serverProcs()
			log, err := g.logger()
			if err != nil {
				return err
			}
			if masters < 1 {
				return fmt.Errorf("--masters %d: want 1 (a single master), 3 or 5", masters)
			}
			// One metrics listener for the whole embedded cluster: the
			// servers' figures carry server="<index>", raft members'
			// master="<id>"; RPC metrics are the process's, all parts
			// together (op tells master and server RPCs apart).
			if err := serveDebug(debug, log); err != nil {
				return err
			}
			pm, err := startMetrics(metricsListen, log)
			if err != nil {
				return err
			}
			defer pm.Close()
			c, err := testcluster.Start(cmd.Context(), testcluster.Options{
				Servers:           servers,
				Masters:           masters,
				Dir:               dir,
				CredentialPath:    g.clusterKeyPath(""),
				MasterListen:      listen,
				Logger:            log,
				HeartbeatInterval: tablemaster.DefaultHeartbeatInterval,
				LeaseDuration:     tablemaster.DefaultLeaseDuration,
				DeadAfter:         tablemaster.DefaultDeadAfter,
				ReplaceAfter:      tablemaster.DefaultReplaceAfter,
				MasterOptions: func(o *tablemaster.Options) {
					o.Rebalance = true
					var labels prometheus.Labels
					if o.RaftID != 0 {
						labels = prometheus.Labels{"master": strconv.FormatUint(o.RaftID, 10)}
					}
					pm.master(o, labels)
				},
				ServerOptions: func(i int, o *tableserver.Options) {
					pm.server(o, prometheus.Labels{"server": strconv.Itoa(i)})
				},
			})
			if err != nil {
				return fmt.Errorf("start dev cluster: %w", err)
			}
			dash, err := startDashboard(dashListen, devDashboard(c), log)
			if err != nil {
				return fmt.Errorf("%w (%v)", err, c.Close())
			}
			defer dash.Close()
			var gw *gatewayServer
			var qsrv *queueServer
			if azureListen != "" || queueListen != "" {
				if err := ensureDevAccount(cmd.Context(), c.MasterAddrs(), c.Credential()); err != nil {
					return fmt.Errorf("the Azure development account: %w (%v)", err, c.Close())
				}
			}
			if queueListen != "" {
				serve, terr := azTLS.config()
				if terr != nil {
					return fmt.Errorf("%w (%v)", terr, c.Close())
				}
				qsrv, err = startQueue(cmd.Context(), gatewayConfig{addr: queueListen, masters: c.MasterAddrs(), cred: c.Credential(), serve: serve, log: log})
				switch {
				case err != nil && !cmd.Flags().Changed("queue-listen"):
					// The default port may be another emulator's.
					fmt.Fprintf(cmd.ErrOrStderr(), "tabula dev: the Azure Queue service is off: %v (give --queue-listen another address)\n", err)
				case err != nil:
					return fmt.Errorf("%w (%v)", err, c.Close())
				default:
					defer qsrv.Close()
				}
			}
			if azureListen != "" {
				cred := c.Credential()
				serve, terr := azTLS.config()
				if terr != nil {
					return fmt.Errorf("%w (%v)", terr, c.Close())
				}
				gw, err = startGateway(cmd.Context(), gatewayConfig{addr: azureListen, masters: c.MasterAddrs(), cred: cred, serve: serve,
					// Development tokens, as Azurite's --oauth basic: over
					// HTTPS (--azure-tls-*), claims checked, no signature.
					bearer: bearer.Dev(), log: log})
				switch {
				case err != nil && !cmd.Flags().Changed("azure-listen"):
					// The default port may be another emulator's: the
					// cluster runs on without the gateway.
					fmt.Fprintf(cmd.ErrOrStderr(), "tabula dev: the Azure Table gateway is off: %v (give --azure-listen another address)\n", err)
				case err != nil:
					return fmt.Errorf("%w (%v)", err, c.Close())
				default:
					defer gw.Close()
				}
			}
			out := cmd.OutOrStdout()
			for i, a := range c.MasterAddrs() {
				if c.Masters() > 1 {
					fmt.Fprintf(out, "master  %s  raft member %d\n", a, i+1)
				} else {
					fmt.Fprintf(out, "master  %s\n", a)
				}
			}
			if hint := devMasterHint(c.MasterAddrs(), os.Getenv); hint != "" {
				fmt.Fprintf(out, "        %s\n", hint)
			}
			ids := c.ServerIDs()
			for i, a := range c.ServerAddrs() {
				fmt.Fprintf(out, "server  %s  id %s  fault-domain fd-%d\n", a, ids[i], i)
			}
			fmt.Fprintf(out, "data    %s\n", c.Dir())
			fmt.Fprintf(out, "credential %s  (the cluster's; %s)\n", c.CredentialPath(), devCredentialHint(c.CredentialPath(), os.Getenv, hasProfile(client.DefaultConfigPath(), "default")))
			if u := pm.URL(); u != "" {
				fmt.Fprintf(out, "metrics %s\n", u)
			}
			if u := dash.URL(); u != "" {
				fmt.Fprintf(out, "dashboard %s\n", u)
			}
			// UseDevelopmentStorage=true names every service's standard
			// address at once: a line offers it only when all of them
			// are there, else its service's explicit string.
			allStd := devAllConnectionString(gw, qsrv) == "UseDevelopmentStorage=true"
			if gw != nil {
				fmt.Fprintf(out, "azure   %s\n", devStd(devAzureLine(gw.URL()), allStd, gw.URL(), "TableEndpoint"))
			}
			if qsrv != nil {
				fmt.Fprintf(out, "queue   %s\n", devStd(devQueueLine(qsrv.URL()), allStd, qsrv.URL(), "QueueEndpoint"))
			}
			if gw != nil || qsrv != nil {
				fmt.Fprintf(out, "blob    not served yet (the Blob service is not built); connection string for what is: %s\n", devAllConnectionString(gw, qsrv))
			}
			fmt.Fprintln(out, "tabula dev ready")
			<-cmd.Context().Done()
			fmt.Fprintln(out, "tabula dev: shutting down")
			return c.Close()
		},
	}
	cmd.Flags().StringVar(&dir, "data", "./tabula-data", "data directory")
	cmd.Flags().StringVar(&listen, "listen", defaultMaster, "master listen address")
	cmd.Flags().IntVar(&servers, "servers", 3, "number of table servers")
	cmd.Flags().IntVar(&masters, "masters", 1, "number of masters: 1, or 3 or 5 for a raft group")
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", metricsListenUsage+"; one page for the whole cluster")
	cmd.Flags().StringVar(&debug, "debug-listen", "", "address serving Go's profiling endpoints, /debug/pprof/ (default: none)")
	cmd.Flags().StringVar(&dashListen, "dashboard-listen", "127.0.0.1:0", dashboardListenUsage+"; the leading master's (empty: off)")
	cmd.Flags().StringVar(&azureListen, "azure-listen", "127.0.0.1:10002", azureListenUsage+"; serves the development account "+sharedkey.DevAccount)
	cmd.Flags().StringVar(&queueListen, "queue-listen", "127.0.0.1:10001", queueListenUsage+"; serves the development account "+sharedkey.DevAccount)
	azTLS.register(cmd.Flags())
	return cmd
}

// devMasterHint tells how the CLI reaches a dev cluster whose master is
// not at the CLI's default address; "" when it is, or when
// $TABULA_MASTER already names it.
func devMasterHint(addrs []string, getenv func(string) string) string {
	list := strings.Join(addrs, ",")
	if list == defaultMaster || getenv("TABULA_MASTER") == list {
		return ""
	}
	return fmt.Sprintf("(not the CLI's default %s: give --master %s or export TABULA_MASTER=%s)", defaultMaster, list, list)
}

// devCredentialHint says truthfully how a CLI command started from this
// directory, with no flags, comes to sign with the dev cluster's
// credential at path, following credential's order; or what to give it
// when it would not. getenv is os.Getenv; defaultProfile says whether the
// profile file has a profile "default" (which comes before a
// ./tabula-data/cluster.key).
func devCredentialHint(path string, getenv func(string) string, defaultProfile bool) string {
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			return filepath.Clean(p)
		}
		return a
	}
	give := fmt.Sprintf("give --cluster-key %s or export TABULA_CLUSTER_KEY=%s", abs(path), abs(path))
	switch {
	case getenv("TABULA_TENANT") != "" && getenv("TABULA_KEY") != "":
		return fmt.Sprintf("the CLI signs as $TABULA_TENANT %s instead; to use this one, %s", getenv("TABULA_TENANT"), give)
	case getenv("TABULA_PROFILE") != "":
		return fmt.Sprintf("the CLI signs with $TABULA_PROFILE %s instead; to use this one, %s", getenv("TABULA_PROFILE"), give)
	case getenv("TABULA_CLUSTER_KEY") != "" && abs(getenv("TABULA_CLUSTER_KEY")) == abs(path):
		return "the CLI finds it through $TABULA_CLUSTER_KEY"
	case getenv("TABULA_CLUSTER_KEY") != "":
		return fmt.Sprintf("the CLI signs with $TABULA_CLUSTER_KEY %s instead; to use this one, give --cluster-key %s", getenv("TABULA_CLUSTER_KEY"), abs(path))
	case defaultProfile:
		return fmt.Sprintf("the CLI signs with your profile \"default\" (%s) instead; to use this one, %s", client.DefaultConfigPath(), give)
	case slices.ContainsFunc(defaultClusterKeys, func(p string) bool { return abs(p) == abs(path) }):
		return "the CLI run in this directory finds it; elsewhere " + give
	}
	return "the CLI does not look there on its own: " + give
}

// hasProfile reports whether the profile file at path has profile name
// (a damaged file counts: the CLI would stop at it too).
func hasProfile(path, name string) bool {
	_, err := client.LoadProfile(path, name)
	return !errors.Is(err, client.ErrNoProfile)
}

// devAzureLine describes the dev cluster's Azure Table endpoint at addr
// and the connection string that reaches it: UseDevelopmentStorage=true
// means http://127.0.0.1:10002 to the Azure SDKs, so any other address
// gets the explicit string.
func devAzureLine(addr string) string {
	scheme := "http"
	if rest, ok := strings.CutPrefix(addr, "https://"); ok {
		scheme, addr = "https", rest
	} else {
		addr = strings.TrimPrefix(addr, "http://")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1" // listening on every address: loopback reaches it
	}
	endpoint := scheme + "://" + net.JoinHostPort(host, port) + "/" + sharedkey.DevAccount
	conn := "UseDevelopmentStorage=true"
	if host != "127.0.0.1" || port != "10002" || scheme == "https" {
		conn = devConnectionString(endpoint)
	}
	return fmt.Sprintf("%s  (Azure Table REST; account %s with its well-known key; connection string: %s)", endpoint, sharedkey.DevAccount, conn)
}

// devConnectionString is the explicit Azure connection string of the
// development account served at endpoint.
func devConnectionString(endpoint string) string {
	scheme, _, _ := strings.Cut(endpoint, "://")
	return fmt.Sprintf("DefaultEndpointsProtocol=%s;AccountName=%s;AccountKey=%s;TableEndpoint=%s;", scheme, sharedkey.DevAccount, sharedkey.DevKey, endpoint)
}

// devEndpoint is the development account's endpoint at a service's base
// URL, and whether it is where UseDevelopmentStorage=true points
// (http://127.0.0.1:port).
func devEndpoint(base, port string) (string, bool) {
	scheme := "http"
	addr := base
	if rest, ok := strings.CutPrefix(base, "https://"); ok {
		scheme, addr = "https", rest
	} else {
		addr = strings.TrimPrefix(addr, "http://")
	}
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		host, p = addr, ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return scheme + "://" + net.JoinHostPort(host, p) + "/" + sharedkey.DevAccount, scheme == "http" && host == "127.0.0.1" && p == port
}

// devStd is a banner line for one service: with another service off its
// standard address, a line's UseDevelopmentStorage=true (right for its
// own service alone) becomes the service's explicit connection string.
func devStd(line string, allStd bool, base, key string) string {
	if allStd || !strings.Contains(line, "UseDevelopmentStorage=true") {
		return line
	}
	endpoint, _ := devEndpoint(base, "")
	scheme, _, _ := strings.Cut(endpoint, "://")
	explicit := fmt.Sprintf("DefaultEndpointsProtocol=%s;AccountName=%s;AccountKey=%s;%s=%s;", scheme, sharedkey.DevAccount, sharedkey.DevKey, key, endpoint)
	return strings.Replace(line, "UseDevelopmentStorage=true", explicit, 1)
}

// devQueueLine describes the dev cluster's Azure Queue endpoint.
func devQueueLine(base string) string {
	endpoint, std := devEndpoint(base, "10001")
	conn := "UseDevelopmentStorage=true"
	if !std {
		scheme, _, _ := strings.Cut(endpoint, "://")
		conn = fmt.Sprintf("DefaultEndpointsProtocol=%s;AccountName=%s;AccountKey=%s;QueueEndpoint=%s;", scheme, sharedkey.DevAccount, sharedkey.DevKey, endpoint)
	}
	return fmt.Sprintf("%s  (Azure Queue REST; account %s with its well-known key; connection string: %s)", endpoint, sharedkey.DevAccount, conn)
}

// devAllConnectionString is one connection string naming every Azure
// service tabula dev serves: UseDevelopmentStorage=true when each is at
// its standard address.
func devAllConnectionString(gw *gatewayServer, qs *queueServer) string {
	std := true
	scheme := "http"
	var eps []string
	if gw != nil {
		ep, ok := devEndpoint(gw.URL(), "10002")
		std = std && ok
		scheme, _, _ = strings.Cut(ep, "://")
		eps = append(eps, "TableEndpoint="+ep+";")
	}
	if qs != nil {
		ep, ok := devEndpoint(qs.URL(), "10001")
		std = std && ok
		scheme, _, _ = strings.Cut(ep, "://")
		eps = append(eps, "QueueEndpoint="+ep+";")
	}
	if std {
		return "UseDevelopmentStorage=true"
	}
	return fmt.Sprintf("DefaultEndpointsProtocol=%s;AccountName=%s;AccountKey=%s;%s", scheme, sharedkey.DevAccount, sharedkey.DevKey, strings.Join(eps, ""))
}
