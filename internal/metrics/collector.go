package metrics

import "github.com/prometheus/client_golang/prometheus"

// Family is one metric family a collector reports: its description and
// type. Make them once (package variables), not per scrape.
type Family struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
}

// Counter is a family of counters (name ending in _total) with the given
// variable labels.
func Counter(name, help string, labels ...string) Family {
	return Family{prometheus.NewDesc(name, help, labels, nil), prometheus.CounterValue}
}

// Gauge is a family of gauges with the given variable labels.
func Gauge(name, help string, labels ...string) Family {
	return Family{prometheus.NewDesc(name, help, labels, nil), prometheus.GaugeValue}
}

// Metric is one sample of f with label values in f's label order. It panics
// on a wrong number of label values (a bug in the collector).
func (f Family) Metric(v float64, labelValues ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(f.desc, f.typ, v, labelValues...)
}

// NewCollector returns a collector of families whose samples collect
// produces at every scrape, reading figures the component already keeps:
// nothing is spent between scrapes. collect must report only samples of
// families and be safe for concurrent use.
func NewCollector(collect func(emit func(prometheus.Metric)), families ...Family) prometheus.Collector {
	return &funcCollector{collect: collect, families: families}
}

type funcCollector struct {
	collect  func(emit func(prometheus.Metric))
	families []Family
}

func (c *funcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range c.families {
		ch <- f.desc
	}
}

func (c *funcCollector) Collect(ch chan<- prometheus.Metric) {
	c.collect(func(m prometheus.Metric) { ch <- m })
}
