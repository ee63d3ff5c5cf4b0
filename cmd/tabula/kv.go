package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// errExit1 makes the command exit 1 after it already printed its message.
type quietError struct{ msg string }

func (e quietError) Error() string { return e.msg }

// writeFlags are the flags of put and del: the request id to retry a
// write whose outcome is unknown, and -v to print its LSN.
type writeFlags struct {
	requestID string
	verbose   bool
}

func (w *writeFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&w.requestID, "request-id", "", "send the write under this request id (default: a random one); repeating a write with the id an \"outcome unknown\" error printed applies it at most once and prints its outcome")
	cmd.Flags().BoolVarP(&w.verbose, "verbose", "v", false, "print the write's log sequence number (LSN) on stderr")
}

// options are the client options of the write; lsn receives its LSN.
func (w *writeFlags) options(lsn *uint64) []client.WriteOption {
	opts := []client.WriteOption{client.ReportLSN(lsn)}
	if w.requestID != "" {
		opts = append(opts, client.WithRequestID(w.requestID))
	}
	return opts
}

// explain adds the CLI's way to settle a write of unknown outcome.
func explainWrite(err error) error {
	var ou *client.OutcomeUnknownError
	if errors.As(err, &ou) {
		return fmt.Errorf("%w\n(to settle it, run the same command again with --request-id %s)", err, ou.RequestID)
	}
	return err
}

// readFlags are the flags of get and scan: which replica may answer.
type readFlags struct {
	read    string
	minLSN  uint64
	maxLag  time.Duration
	verbose bool
}

func (r *readFlags) add(cmd *cobra.Command, verbose bool) {
	cmd.Flags().StringVar(&r.read, "read", "primary", "which replica answers: primary (linearizable) or any (any replica: eventual, see --min-lsn)")
	cmd.Flags().Uint64Var(&r.minLSN, "min-lsn", 0, "only a replica that has applied at least this LSN of the partition's log answers (the LSN a put -v printed: read your write from any replica)")
	cmd.Flags().DurationVar(&r.maxLag, "max-lag", 0, "with --read any: only a replica in step with its primary within this answers (others refuse; the primary answers last); 0: the server's default, 1s")
	if verbose {
		cmd.Flags().BoolVarP(&r.verbose, "verbose", "v", false, "print the LSN the answer reflects on stderr")
	}
}

func (r *readFlags) options(lsn *uint64) ([]client.ReadOption, error) {
	var opts []client.ReadOption
	switch r.read {
	case "primary":
	case "any":
		opts = append(opts, client.ReadAny())
	default:
		return nil, fmt.Errorf("--read %q: want primary or any", r.read)
	}
	if r.minLSN > 0 {
		opts = append(opts, client.MinLSN(r.minLSN))
	}
	switch {
	case r.maxLag < 0:
		return nil, fmt.Errorf("--max-lag %v: want a positive duration", r.maxLag)
	case r.maxLag > 0 && r.read != "any":
		return nil, fmt.Errorf("--max-lag needs --read any (the primary is never behind)")
	case r.maxLag > 0:
		opts = append(opts, client.MaxStaleness(r.maxLag))
	}
	if lsn != nil {
		opts = append(opts, client.ReportLSN(lsn))
	}
	return opts, nil
}

func putCmd(g *globals) *cobra.Command {
	var ttl time.Duration
	var wf writeFlags
	cmd := &cobra.Command{
		Use:   "put TABLE KEY [VALUE]",
		Short: "Write a value (from the argument, or stdin when omitted)",
		Args:  cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			var value []byte
			if len(args) == 3 {
				value = []byte(args[2])
			} else {
				v, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), api.MaxValueBytesLimit+1))
				if err != nil {
					return fmt.Errorf("read value from stdin: %w", err)
				}
				value = v
			}
			if ttl < 0 {
				return fmt.Errorf("--ttl %v is negative", ttl)
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			var lsn uint64
			opts := wf.options(&lsn)
			if ttl > 0 {
				opts = append(opts, client.WithTTL(ttl))
			}
			if err := c.Table(args[0]).Put(ctx, []byte(args[1]), value, opts...); err != nil {
				return explainWrite(fmt.Errorf("put %s %s: %w", args[0], showKey(args[1]), err))
			}
			if wf.verbose {
				fmt.Fprintf(cmd.ErrOrStderr(), "lsn %d\n", lsn)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "expire the value after this long (0: the table's default)")
	wf.add(cmd)
	return cmd
}

func getCmd(g *globals) *cobra.Command {
	var rf readFlags
	cmd := &cobra.Command{
		Use:   "get TABLE KEY",
		Short: "Print a value (raw bytes; a newline is added on a terminal). Exit 1 if absent",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var lsn uint64
			opts, err := rf.options(&lsn)
			if err != nil {
				return err
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			v, err := c.Table(args[0]).Get(ctx, []byte(args[1]), opts...)
			if rf.verbose && (err == nil || errors.Is(err, client.ErrKeyNotFound)) {
				fmt.Fprintf(cmd.ErrOrStderr(), "lsn %d\n", lsn)
			}
			if errors.Is(err, client.ErrKeyNotFound) {
				return quietError{fmt.Sprintf("key %s not found in %s", showKey(args[1]), args[0])}
			}
			if err != nil {
				return fmt.Errorf("get %s %s: %w", args[0], showKey(args[1]), err)
			}
			out := cmd.OutOrStdout()
			if _, err := out.Write(v); err != nil {
				return err
			}
			if f, ok := out.(*os.File); ok && isTerminal(f) {
				fmt.Fprintln(out)
			}
			return nil
		},
	}
	rf.add(cmd, true)
	return cmd
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func delCmd(g *globals) *cobra.Command {
	var wf writeFlags
	cmd := &cobra.Command{
		Use:   "del TABLE KEY",
		Short: "Delete a key",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			var lsn uint64
			existed, err := c.Table(args[0]).Delete(ctx, []byte(args[1]), wf.options(&lsn)...)
			if err != nil {
				return explainWrite(fmt.Errorf("del %s %s: %w", args[0], showKey(args[1]), err))
			}
			if existed {
				fmt.Fprintln(cmd.OutOrStdout(), "deleted")
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), "key did not exist")
			}
			if wf.verbose {
				fmt.Fprintf(cmd.ErrOrStderr(), "lsn %d\n", lsn)
			}
			return nil
		},
	}
	wf.add(cmd)
	return cmd
}

func scanCmd(g *globals) *cobra.Command {
	var (
		rf       readFlags
		from, to string
		reverse  bool
		limit    int
	)
	cmd := &cobra.Command{
		Use:   "scan TABLE",
		Short: "Print every record as KEY<TAB>VALUE lines (quoted when not printable)",
		Long: `Print every record as KEY<TAB>VALUE lines (quoted when not printable).
Point and bulk tables print their records in no order. Ordered tables print
them in key order, and take a range (--from, --to), --reverse and --limit.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := rf.options(nil)
			if err != nil {
				return err
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			out := cmd.OutOrStdout()
			n := 0
			show := func(k, v []byte) error {
				n++
				_, err := fmt.Fprintf(out, "%s\t%s\n", printable(k), printable(v))
				return err
			}
			fl := cmd.Flags()
			if fl.Changed("from") || fl.Changed("to") || reverse || limit != 0 {
				if limit < 0 {
					return fmt.Errorf("--limit %d is negative", limit)
				}
				rs := client.RangeScan{Reverse: reverse, Limit: limit}
				if fl.Changed("from") {
					rs.Start = []byte(from)
				}
				if fl.Changed("to") {
					rs.End = []byte(to)
				}
				err = c.Table(args[0]).ScanRange(ctx, rs, show, opts...)
			} else {
				err = c.Table(args[0]).Scan(ctx, show, opts...)
			}
			if err != nil {
				return fmt.Errorf("scan %s (after %d records): %w", args[0], n, err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%d records\n", n)
			return nil
		},
	}
	rf.add(cmd, false)
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "ordered tables: the first key of the range")
	f.StringVar(&to, "to", "", "ordered tables: the first key past the range")
	f.BoolVar(&reverse, "reverse", false, "ordered tables: descending key order")
	f.IntVar(&limit, "limit", 0, "ordered tables: print at most this many records (0: all)")
	return cmd
}

// printable returns b as is when it is printable UTF-8 (no tabs or
// newlines) that does not start with a double quote, else Go-quoted, so every
// line splits unambiguously at its tab.
func printable(b []byte) string {
	if !utf8.Valid(b) || (len(b) > 0 && b[0] == '"') {
		return strconv.Quote(string(b))
	}
	for _, r := range string(b) {
		if !strconv.IsPrint(r) || r == '\t' {
			return strconv.Quote(string(b))
		}
	}
	return string(b)
}

// showKeyMax is how much of a key a message quotes.
const showKeyMax = 64

// showKey quotes key for a message, cut to its first showKeyMax bytes
// (with its length) when longer: an error about a 5 KB key is one line.
func showKey(key string) string {
	if len(key) <= showKeyMax {
		return strconv.Quote(key)
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(key[:showKeyMax]), len(key))
}
