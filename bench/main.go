package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/auth"
)

// suite is one benchmark suite.
type suite struct {
	name  string
	about string
	run   func(w io.Writer, args []string) error
}

var suites = map[string]suite{}

// register adds s; suites call it from init.
func register(s suite) {
	if _, dup := suites[s.name]; dup {
		panic("bench: suite " + s.name + " registered twice")
	}
	suites[s.name] = s
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: go run . <suite> [args]")
	fmt.Fprintln(w, "suites:")
	names := make([]string, 0, len(suites))
	for n := range suites {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, suites[n].about)
	}
}

// benchCred is the cluster credential of the clusters the suites start.
var benchCred client.Credential

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	s, ok := suites[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "bench: unknown suite %q\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(2)
	}
	// Clusters the suites start from the tabula binary read the cluster
	// credential from $TABULA_CLUSTER_KEY; the suites' clients sign with it.
	keyDir, err := os.MkdirTemp("", "tabula-bench-key-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(keyDir)
	if os.Getenv("TABULA_CLUSTER_KEY") == "" {
		os.Setenv("TABULA_CLUSTER_KEY", filepath.Join(keyDir, "cluster.key"))
	}
	c, err := client.ReadCredentialFile(os.Getenv("TABULA_CLUSTER_KEY"))
	if err != nil {
		ac, _, cerr := auth.LoadOrCreateClusterCredential(os.Getenv("TABULA_CLUSTER_KEY"))
		if cerr != nil {
			fmt.Fprintln(os.Stderr, "bench: cluster credential:", cerr)
			os.Exit(1)
		}
		c = client.Credential(ac)
	}
	benchCred = c
	if err := s.run(os.Stdout, os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", s.name, err)
		os.Exit(1)
	}
}

// suiteDir returns the directory a suite keeps its data and process logs
// in: given, or a new temporary one. Call keep with the suite's error
// when it returns: a temporary directory is removed after a successful
// run and kept (and named on stderr) after a failed one.
func suiteDir(suite, given string) (dir string, keep func(err error), err error) {
	if given != "" {
		return given, func(error) {}, nil
	}
	d, err := os.MkdirTemp("", "tabula-bench-"+suite+"-")
	if err != nil {
		return "", nil, err
	}
	return d, func(err error) {
		if err == nil {
			_ = os.RemoveAll(d)
		} else {
			fmt.Fprintf(os.Stderr, "%s: data and process logs kept in %s\n", suite, d)
		}
	}, nil
}
