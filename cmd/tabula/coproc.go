package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/client"
)

func coprocCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "coproc", Short: "Deploy, list, roll back and invoke WebAssembly coprocessors"}
	cmd.AddCommand(coprocDeployCmd(g), coprocListCmd(g), coprocRollbackCmd(g), coprocInvokeCmd(g))
	return cmd
}

func coprocDeployCmd(g *globals) *cobra.Command {
	var table, name, wasm string
	var wait bool
	cmd := &cobra.Command{
		Use:   "deploy --table T --name N --wasm FILE",
		Short: "Register a module as the next version of a table's coprocessor (live once every server compiled it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if table == "" || name == "" || wasm == "" {
				return errors.New("--table, --name and --wasm are required")
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			t := c.Table(table)
			start := time.Now()
			v, err := t.DeployCoproc(ctx, name, wasm)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deployed %s version %d to %s\n", name, v, table)
			if wait {
				if err := showCompiling(ctx, cmd.ErrOrStderr(), t, name, v); err != nil {
					return err
				}
				if err := t.WaitCoprocLive(ctx, name, v); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s version %d is live (compiled on every server) after %v\n", name, v, time.Since(start).Round(time.Millisecond))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&table, "table", "", "table")
	f.StringVar(&name, "name", "", "coprocessor name")
	f.StringVar(&wasm, "wasm", "", "WebAssembly module (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared)")
	f.BoolVar(&wait, "wait", true, "wait until the version is live")
	return cmd
}

func coprocListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "list TABLE", Aliases: []string{"describe"}, Short: "List a table's coprocessors and their versions", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			cs, err := c.Table(args[0]).Coprocs(ctx)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tVERSION\tLIVE\tREADY\tSIZE\tSHA256\tMETHODS")
			for _, cp := range cs {
				for _, v := range cp.GetVersions() {
					live := ""
					if v.GetVersion() == cp.GetLive() {
						live = "live"
					}
					fmt.Fprintf(w, "%s\t%d\t%s\t%d/%d\t%d\t%s\t%s\n", cp.GetName(), v.GetVersion(), live, v.GetReadyServers(), cp.GetServers(),
						v.GetSize(), v.GetSha256()[:16], strings.Join(v.GetMethods(), ","))
				}
			}
			return w.Flush()
		},
	}
}

func coprocRollbackCmd(g *globals) *cobra.Command {
	var version uint64
	cmd := &cobra.Command{
		Use: "rollback TABLE NAME --version V", Short: "Point a coprocessor's live alias at another version", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if version == 0 {
				return errors.New("--version is required (tabula coproc list shows them)")
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.Table(args[0]).RollbackCoproc(ctx, args[1], version); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s of %s: live is version %d\n", args[1], args[0], version)
			return nil
		},
	}
	cmd.Flags().Uint64Var(&version, "version", 0, "version to make live")
	return cmd
}

func coprocInvokeCmd(g *globals) *cobra.Command {
	var (
		key, keys, rng, input, token string
		all, partial, asHex          bool
		version                      uint64
		timeout                      time.Duration
	)
	cmd := &cobra.Command{
		Use:   "invoke TABLE NAME METHOD (--key K | --keys K1,K2,... | --range A..B | --all) [--input FILE]",
		Short: "Run a coprocessor handler next to the data and print its output",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			inv := client.Invocation{All: all, Version: version, IdempotencyToken: token, Timeout: timeout, AllowPartial: partial}
			switch {
			case key != "":
				inv.Keys = [][]byte{[]byte(key)}
			case keys != "":
				for _, k := range strings.Split(keys, ",") {
					inv.Keys = append(inv.Keys, []byte(k))
				}
			case rng != "":
				start, end, ok := strings.Cut(rng, "..")
				if !ok {
					return fmt.Errorf("--range %q: want START..END (either may be empty: unbounded)", rng)
				}
				inv.Range = &client.KeyRange{}
				if start != "" {
					inv.Range.Start = []byte(start)
				}
				if end != "" {
					inv.Range.End = []byte(end)
				}
			case !all:
				return errors.New("give --key, --keys, --range or --all")
			}
			given := 0
			for _, f := range []string{"key", "keys", "range", "all"} {
				if cmd.Flags().Changed(f) {
					given++
				}
			}
			if given > 1 {
				return errors.New("give only one of --key, --keys, --range and --all")
			}
			if input != "" {
				b, err := os.ReadFile(input)
				if err != nil {
					return err
				}
				inv.Input = b
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			out, err := c.Table(args[0]).Invoke(ctx, args[1], args[2], inv)
			if err != nil {
				return err
			}
			if asHex {
				fmt.Fprintln(cmd.OutOrStdout(), hex.EncodeToString(out))
				return nil
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&key, "key", "", "run on this key's partition with it as the target")
	f.StringVar(&keys, "keys", "", "comma-separated keys: one call per partition, outputs merged")
	f.StringVar(&rng, "range", "", "START..END: run on every partition over the keys in [START, END), outputs merged")
	f.BoolVar(&all, "all", false, "run on every partition, outputs merged")
	f.StringVar(&input, "input", "", "file whose bytes are the handler's input")
	f.StringVar(&token, "token", "", "idempotency token: a retry with the same token applies once")
	f.Uint64Var(&version, "version", 0, "run this version instead of the live one")
	f.DurationVar(&timeout, "call-timeout", 0, "guest deadline per call (default: the server's, 1s)")
	f.BoolVar(&partial, "allow-partial", false, "merge the partitions that answered when some fail")
	f.BoolVar(&asHex, "hex", false, "print the output as hex")
	return cmd
}

// showCompiling shows, until version of coprocessor name is live, how
// many of the servers hosting the table have compiled it: compiling takes
// seconds, and a deploy that waited in silence looked hung.
func showCompiling(ctx context.Context, w io.Writer, t *client.Table, name string, version uint64) error {
	live := &liveLine{w: w, tty: writerIsTerminal(w)}
	defer live.clear()
	last := ""
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		cs, err := t.Coprocs(ctx)
		if err != nil {
			return err
		}
		for _, c := range cs {
			if c.GetName() != name {
				continue
			}
			if c.GetLive() >= version {
				return nil
			}
			for _, cv := range c.GetVersions() {
				if cv.GetVersion() != version {
					continue
				}
				line := fmt.Sprintf("compiling %s version %d: %d of %d servers ready", name, version, cv.GetReadyServers(), c.GetServers())
				if line != last {
					live.show(line)
					last = line
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s version %d is not live yet (%s): %w", name, version, last, ctx.Err())
		case <-tick.C:
		}
	}
}
