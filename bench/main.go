package main

import (
	"fmt"
	"io"
	"os"
	"sort"
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
	if err := s.run(os.Stdout, os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", s.name, err)
		os.Exit(1)
	}
}
