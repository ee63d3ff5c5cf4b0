package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/tlsfiles"
)

// defaultMaster is the address `tabula dev` and `tabula master` listen on by
// default, and so the default of every client command's --master.
const defaultMaster = "127.0.0.1:7100"

// globals are the flags every command shares.
type globals struct {
	master     []string
	tenant     string
	timeout    time.Duration
	logLevel   string
	logFormat  string
	clusterKey string         // --cluster-key
	tls        tlsfiles.Files // --tls-cert, --tls-key, --tls-ca
	profile    string         // --profile
	keyFile    string         // --key-file
	flags      *pflag.FlagSet
	// masterSet: the masters were named, by --master or $TABULA_MASTER,
	// so a profile's do not apply.
	masterSet bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tabula:", describeErr(err))
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "tabula",
		Short:         "Tabula: a multi-tenant key-value platform",
		Long:          "Tabula runs table servers under a Table Master and serves point tables over gRPC.\nStart a local cluster with `tabula dev`, then use the client commands against it.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringSliceVar(&g.master, "master", []string{defaultMaster}, "Table Master address(es), comma-separated; without it: $TABULA_MASTER, else the signing profile's master, else the default")
	pf.StringVar(&g.tenant, "tenant", api.DefaultTenant, "tenant to act as")
	pf.DurationVar(&g.timeout, "timeout", 30*time.Second, "deadline of a client command (retries included)")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format: text (key=value) or json (one object per line)")
	pf.StringVar(&g.tls.Cert, "tls-cert", os.Getenv("TABULA_TLS_CERT"), "PEM certificate chain a master or server serves TLS with ($TABULA_TLS_CERT); with any --tls-* flag every connection is TLS")
	pf.StringVar(&g.tls.Key, "tls-key", os.Getenv("TABULA_TLS_KEY"), "PEM private key of --tls-cert ($TABULA_TLS_KEY)")
	pf.StringVar(&g.tls.CA, "tls-ca", os.Getenv("TABULA_TLS_CA"), "PEM certificate authorities to trust when connecting ($TABULA_TLS_CA; default: the system's); a client command with it dials TLS")
	pf.StringVar(&g.clusterKey, "cluster-key", "", "the cluster credential file (default $TABULA_CLUSTER_KEY, else: tabula dev and tabula master create <data>/cluster.key; client commands look for ./tabula-data/cluster.key)")
	pf.StringVar(&g.profile, "profile", "", "profile to use from the profile file ($TABULA_PROFILE, else \"default\"; file: $TABULA_CONFIG or ~/.config/tabula/config)")
	pf.StringVar(&g.keyFile, "key-file", "", "a credential file to sign with (a tenant's, or the cluster's)")
	g.flags = pf
	root.PersistentPreRunE = func(*cobra.Command, []string) error { return g.resolveMaster() }
	root.AddCommand(
		devCmd(g), masterCmd(g), serverCmd(g), gatewayCmd(g),
		tableCmd(g), putCmd(g), getCmd(g), delCmd(g), scanCmd(g),
		workloadCmd(g), bulkCmd(g), streamCmd(g), extentCmd(g), coprocCmd(g), partitionCmd(g), tenantCmd(g), clusterCmd(g),
	)
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every command group (a command with
// subcommands and no action of its own) fail on a word that names none of
// them, suggesting the nearest: cobra otherwise prints the group's help
// and exits 0, so a mistyped `tabula partition splt` looked like success
// to a script. A group given no word still prints its help.
func refuseUnknownSubcommands(c *cobra.Command) {
	const groupAnnotation = "tabula-group" // a group: it has no action of its own
	for _, sub := range c.Commands() {
		refuseUnknownSubcommands(sub)
	}
	if c == c.Root() || !c.HasSubCommands() || c.Runnable() {
		return // the root refuses unknown commands itself
	}
	c.Annotations = map[string]string{groupAnnotation: "true"}
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return fmt.Errorf("%s (see %s --help)", msg, cmd.CommandPath())
	}
}

func (g *globals) logger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", g.logLevel)
	}
	ho := &slog.HandlerOptions{Level: lvl}
	switch g.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, ho)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", g.logFormat)
}

// resolveMaster applies $TABULA_MASTER when --master is not given. The
// order, first found: --master, $TABULA_MASTER, the master of the
// profile the command signs with (credential applies it), 127.0.0.1:7100.
func (g *globals) resolveMaster() error {
	if g.flags.Changed("master") {
		g.masterSet = true
		return nil
	}
	env := os.Getenv("TABULA_MASTER")
	if env == "" {
		return nil
	}
	var addrs []string
	for _, a := range strings.Split(env, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return fmt.Errorf("$TABULA_MASTER %q names no address", env)
	}
	g.master, g.masterSet = addrs, true
	return nil
}

// connectCredential finds the credential (which may take the masters from
// a profile) and then checks that a master answers. Not reaching a master
// is reported first: with no cluster running it is the error to fix.
func (g *globals) connectCredential(ctx context.Context) (client.Credential, error) {
	cred, credErr := g.credential()
	if err := g.reachable(ctx); err != nil {
		return client.Credential{}, err
	}
	return cred, credErr
}

// client connects to the masters (see resolveMaster) as --tenant.
func (g *globals) client(ctx context.Context) (*client.Client, error) {
	cred, err := g.connectCredential(ctx)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := g.tls.Client()
	if err != nil {
		return nil, err
	}
	return client.New(ctx, client.Options{Masters: g.master, Tenant: g.tenantFor(cred), Credential: cred, RetryTimeout: g.timeout, TLS: tlsCfg})
}

// noMasterWait is how long a client command tries to reach any --master
// address before it says none answers (instead of retrying in silence
// until --timeout).
const noMasterWait = 2 * time.Second

// reachable checks that some --master address accepts a connection,
// trying every 200 ms for noMasterWait (two tries when every address
// refuses the connection): a command with no master running fails in
// about 0.2 s with one line naming the addresses. A
// master that accepts connections but does not answer (stopped, or
// electing a leader) is left to the command's own retries.
func (g *globals) reachable(ctx context.Context) error {
	if len(g.master) == 0 {
		return errors.New("no master address: give --master ADDR or set $TABULA_MASTER")
	}
	ctx, cancel := context.WithTimeout(ctx, noMasterWait)
	defer cancel()
	var last error
	for round := 1; ; round++ {
		refused := 0
		for _, addr := range g.master {
			var d net.Dialer
			dctx, dcancel := context.WithTimeout(ctx, 500*time.Millisecond)
			conn, err := d.DialContext(dctx, "tcp", addr)
			dcancel()
			if err == nil {
				_ = conn.Close()
				return nil
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				refused++
			}
			last = err
		}
		// Nothing listens anywhere, twice in a row: say so now rather
		// than after noMasterWait (a master restarting listens again
		// within that; one that is not running never will).
		done := ctx.Done()
		if refused == len(g.master) && round >= 2 {
			now := make(chan struct{})
			close(now)
			done = now
		}
		select {
		case <-done:
			if errors.Is(ctx.Err(), context.Canceled) {
				return ctx.Err()
			}
			why := last.Error()
			var op *net.OpError
			if errors.As(last, &op) && op.Err != nil {
				why = op.Err.Error()
			}
			return fmt.Errorf("no master answers at %s (%s); is one running? `tabula dev` starts a local cluster; --master or $TABULA_MASTER names another", strings.Join(g.master, ", "), why)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// masterCallFor is masterCall for a call that returns a reply.
func masterCallFor[T any](ctx context.Context, g *globals, fn func(api.MasterClient) (T, error)) (T, error) {
	var out T
	err := g.masterCall(ctx, func(mc api.MasterClient) error {
		var err error
		out, err = fn(mc)
		return err
	})
	return out, err
}

// masterCall calls fn with a client of each --master address in turn until
// one answers with anything but UNAVAILABLE: for the operator RPCs the SDK
// does not wrap (ForgetServer, ListDataLoss).
func (g *globals) masterCall(ctx context.Context, fn func(api.MasterClient) error) error {
	cred, err := g.connectCredential(ctx)
	if err != nil {
		return err
	}
	for _, addr := range g.master {
		tlsCfg, tlsErr := g.tls.Client()
		if tlsErr != nil {
			return tlsErr
		}
		dopts := append(cred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()), api.FastReconnect(), api.Keepalive())
		cc, dialErr := grpc.NewClient(addr, append(dopts, tlsfiles.DialOption(tlsCfg)...)...)
		if dialErr != nil {
			err = fmt.Errorf("master address %q: %w", addr, dialErr)
			continue
		}
		err = fn(api.NewMasterClient(cc))
		_ = cc.Close()
		if err == nil || api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNAVAILABLE || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// withTimeout bounds a one-shot client command by --timeout.
func (g *globals) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, g.timeout)
}

// describeErr renders an error for a person: the Tabula error code and
// reason when the error carries one.
func describeErr(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return err.Error()
	}
	d := api.DetailOf(err)
	code := strings.TrimPrefix(d.GetCode().String(), "ERROR_CODE_")
	msg := err.Error()
	if i := strings.Index(msg, "desc = "); i >= 0 {
		msg = msg[:strings.Index(msg, "rpc error:")] + msg[i+len("desc = "):]
	}
	if d.GetCode() == api.ErrorCode_ERROR_CODE_UNSPECIFIED {
		return msg
	}
	return fmt.Sprintf("%s (%s, %s)", msg, code, d.GetReason())
}
