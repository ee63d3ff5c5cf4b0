package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestUnknownSubcommandFails: every command group refuses a word naming
// none of its subcommands (non-zero exit), and suggests the nearest.
func TestUnknownSubcommandFails(t *testing.T) {
	var groups []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Annotations["tabula-group"] != "" {
			groups = append(groups, strings.TrimPrefix(c.CommandPath(), "tabula "))
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(rootCmd())
	if len(groups) < 5 {
		t.Fatalf("found only %d command groups: %v", len(groups), groups)
	}
	for _, g := range groups {
		root := rootCmd()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs(append(strings.Fields(g), "no-such-subcommand"))
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), "unknown command") {
			t.Errorf("tabula %s no-such-subcommand: %v, want an unknown-command error", g, err)
		}
		// The group alone still prints its help and succeeds.
		root = rootCmd()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs(strings.Fields(g))
		if err := root.Execute(); err != nil {
			t.Errorf("tabula %s: %v, want its help", g, err)
		}
	}
	root := rootCmd()
	root.SetOut(io.Discard)
	root.SetArgs([]string{"table", "creat"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "did you mean create?") {
		t.Errorf("tabula table creat: %v, want a suggestion of create", err)
	}
}
