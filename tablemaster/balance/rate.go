package balance

import (
	"math"
	"time"
)

// Rate turns samples of a counter into a smoothed rate per second: an
// exponentially weighted moving average of the rate between samples,
// whose weight halves every half-life (the window). For the first
// half-life it is the plain average since the first sample instead: the
// rate of one short interval (a replica catching up applies a burst) is
// too noisy to plan on. A counter that goes down (its replica reopened,
// its server restarted) starts again from the new value without a sample.
// The zero value is ready; not safe for concurrent use.
type Rate struct {
	last  uint64
	at    time.Time
	rate  float64
	began bool // a first sample was taken
	warm  bool // a rate was measured
	// first and since: the first sample, while the rate is the average
	// since it (less than a half-life ago).
	first uint64
	since time.Time
}

// Observe records that the counter read count at time at.
func (r *Rate) Observe(count uint64, at time.Time, halfLife time.Duration) {
	if !r.began {
		r.last, r.at, r.began = count, at, true
		r.first, r.since = count, at
		return
	}
	if count < r.last {
		r.last, r.at, r.since = count, at, time.Time{}
		return
	}
	dt := at.Sub(r.at)
	if dt <= 0 {
		return
	}
	inst := float64(count-r.last) / dt.Seconds()
	if span := at.Sub(r.since); !r.since.IsZero() && span < halfLife {
		r.rate, r.warm = float64(count-r.first)/span.Seconds(), true
	} else if !r.warm {
		r.rate, r.warm = inst, true
	} else {
		w := 1 - math.Exp2(-dt.Seconds()/halfLife.Seconds())
		r.rate += w * (inst - r.rate)
	}
	r.last, r.at = count, at
}

// PerSec is the smoothed rate; 0 before two samples.
func (r *Rate) PerSec() float64 { return r.rate }

// Warm reports whether a rate has been measured (two samples).
func (r *Rate) Warm() bool { return r.warm }
