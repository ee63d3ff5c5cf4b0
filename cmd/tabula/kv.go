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

func putCmd(g *globals) *cobra.Command {
	var ttl time.Duration
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
			var opts []client.WriteOption
			if ttl > 0 {
				opts = append(opts, client.WithTTL(ttl))
			}
			if err := c.Table(args[0]).Put(ctx, []byte(args[1]), value, opts...); err != nil {
				return fmt.Errorf("put %s %q: %w", args[0], args[1], err)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "expire the value after this long (0: the table's default)")
	return cmd
}

func getCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get TABLE KEY",
		Short: "Print a value (raw bytes; a newline is added on a terminal). Exit 1 if absent",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			v, err := c.Table(args[0]).Get(ctx, []byte(args[1]))
			if errors.Is(err, client.ErrKeyNotFound) {
				return quietError{fmt.Sprintf("key %q not found in %s", args[1], args[0])}
			}
			if err != nil {
				return fmt.Errorf("get %s %q: %w", args[0], args[1], err)
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
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func delCmd(g *globals) *cobra.Command {
	return &cobra.Command{
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
			existed, err := c.Table(args[0]).Delete(ctx, []byte(args[1]))
			if err != nil {
				return fmt.Errorf("del %s %q: %w", args[0], args[1], err)
			}
			if existed {
				fmt.Fprintln(cmd.OutOrStdout(), "deleted")
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), "key did not exist")
			}
			return nil
		},
	}
}

func scanCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "scan TABLE",
		Short: "Print every record as KEY<TAB>VALUE lines (quoted when not printable)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			out := cmd.OutOrStdout()
			n := 0
			err = c.Table(args[0]).Scan(ctx, func(k, v []byte) error {
				n++
				_, err := fmt.Fprintf(out, "%s\t%s\n", printable(k), printable(v))
				return err
			})
			if err != nil {
				return fmt.Errorf("scan %s (after %d records): %w", args[0], n, err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%d records\n", n)
			return nil
		},
	}
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
