package main

import (
	"strings"
	"testing"
)

func TestDevQueueLine(t *testing.T) {
	if got := devQueueLine("http://127.0.0.1:10001"); !strings.Contains(got, "connection string: UseDevelopmentStorage=true") {
		t.Fatalf("standard address: %s", got)
	}
	got := devQueueLine("http://0.0.0.0:11001")
	if !strings.Contains(got, "QueueEndpoint=http://127.0.0.1:11001/devstoreaccount1;") || strings.Contains(got, "UseDevelopmentStorage") {
		t.Fatalf("other address: %s", got)
	}
}
