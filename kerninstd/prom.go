package kerninstd

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Prometheus exposition of every live session, read from the counter
// heap at scrape time (no sampling loop): counters and timer totals are
// Prometheus counters, so rate() over them gives calls/s and, for the
// wall-time total, the average concurrency; their ratio of rates is the
// average latency.
var (
	promProbeCount = prometheus.NewDesc("kinst_probe_count_total",
		"Executions of an instrumented instruction since its session began.",
		[]string{"session", "point", "location"}, nil)
	promCalls = prometheus.NewDesc("kinst_function_calls_total",
		"api.Calls of a timed kernel function since its session began.",
		[]string{"session", "function", "filter"}, nil)
	promWall = prometheus.NewDesc("kinst_function_wall_seconds_total",
		"Thread-time spent inside a timed function (the sum of every call's wall time, unfinished calls included); its rate is the average number of threads inside.",
		[]string{"session", "function", "filter"}, nil)
	promInside = prometheus.NewDesc("kinst_function_threads_inside",
		"Threads inside a timed function at the scrape.",
		[]string{"session", "function", "filter"}, nil)
	promSessions = prometheus.NewDesc("kinst_sessions",
		"Live instrumentation sessions.", nil, nil)
)

type promCollector struct{ d *Daemon }

func (c promCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{promProbeCount, promCalls, promWall, promInside, promSessions} {
		ch <- d
	}
}

func (c promCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(promSessions, prometheus.GaugeValue, float64(len(d.sessions)))
	now := d.clock.Now()
	for _, ss := range d.sessions {
		for _, r := range ss.reqs {
			at := d.eng.Installed(r).Site
			ch <- prometheus.MustNewConstMetric(promProbeCount, prometheus.CounterValue, float64(d.eng.Counter(r.Counter())),
				ss.name, at.Point().Spec, at.Where())
		}
		for _, c := range ss.bpf {
			ch <- prometheus.MustNewConstMetric(promProbeCount, prometheus.CounterValue, float64(d.eng.Counter(c.slot)),
				ss.name, c.site.Point().Spec, c.site.Where())
		}
		for _, t := range ss.timers {
			pt := d.tm.timerPoint(t, now)
			ch <- prometheus.MustNewConstMetric(promCalls, prometheus.CounterValue, float64(pt.Calls), ss.name, t.function, t.filter)
			ch <- prometheus.MustNewConstMetric(promWall, prometheus.CounterValue, pt.WallNS/1e9, ss.name, t.function, t.filter)
			ch <- prometheus.MustNewConstMetric(promInside, prometheus.GaugeValue, float64(pt.Inside), ss.name, t.function, t.filter)
		}
	}
}

// metricsHandler serves every live session of d's metrics in the
// Prometheus exposition format.
func metricsHandler(d *Daemon) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(promCollector{d})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// MetricsOnlyHandler is what the opt-in metrics listener serves: /metrics
// and nothing else (the instrumentation API stays on the unix socket).
func (d *Daemon) MetricsOnlyHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metricsHandler(d))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, fmt.Sprintf("kerninstd serves only /metrics here, not %s", r.URL.Path), http.StatusNotFound)
	})
	return mux
}
