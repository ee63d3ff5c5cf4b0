package raftnode

import "time"

// Clock makes the tickers that drive raft's logical clock; tests inject
// one they advance by hand.
type Clock interface {
	NewTicker(d time.Duration) Ticker
}

// Ticker delivers ticks on C until stopped, as time.Ticker does.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// SystemClock is the real clock.
type SystemClock struct{}

// NewTicker returns a time.Ticker.
func (SystemClock) NewTicker(d time.Duration) Ticker { return systemTicker{time.NewTicker(d)} }

type systemTicker struct{ t *time.Ticker }

func (t systemTicker) C() <-chan time.Time { return t.t.C }
func (t systemTicker) Stop()               { t.t.Stop() }
