package docgen

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Recorder is a prometheus.Registerer that keeps what is registered on it,
// for Metrics: kvnet's RegisterMetrics registers every metric it declares.
type Recorder struct{ collectors []prometheus.Collector }

// Register implements prometheus.Registerer.
func (r *Recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

// MustRegister implements prometheus.Registerer.
func (r *Recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

// Unregister implements prometheus.Registerer.
func (r *Recorder) Unregister(prometheus.Collector) bool { return false }

// valueTyped is a collector of kvnet's own that says the type of the
// series it exports.
type valueTyped interface {
	ValueType() prometheus.ValueType
}

// descFields reads a Desc's String (client_golang has no getters): its
// name and help quoted, its variable labels listed.
var descFields = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"),(?: unit: "[^"]*",)? constLabels: \{[^}]*\}, variableLabels: \{([^}]*)\}\}$`)

type metric struct {
	name, kind, help string
	labels           []string
}

// Metrics is docs/metrics.md: every metric registered on r, by name, with
// its type, its labels and its help text.
func Metrics(r *Recorder) (string, error) {
	var all []metric
	for _, c := range r.collectors {
		kind, err := kindOf(c)
		if err != nil {
			return "", err
		}
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descFields.FindStringSubmatch(d.String())
			if m == nil {
				return "", fmt.Errorf("unreadable %s", d)
			}
			name, err := strconv.Unquote(m[1])
			if err != nil {
				return "", err
			}
			help, err := strconv.Unquote(m[2])
			if err != nil {
				return "", err
			}
			var labels []string
			for _, l := range strings.Split(m[3], ",") {
				if l = strings.TrimSpace(l); l != "" {
					labels = append(labels, "`"+l+"`")
				}
			}
			all = append(all, metric{name: name, kind: kind, help: help, labels: labels})
		}
	}
	slices.SortFunc(all, func(a, b metric) int { return strings.Compare(a.name, b.name) })
	var b strings.Builder
	b.WriteString(Header)
	b.WriteString("# Metrics reference\n\n")
	b.WriteString("Every metric kvnet declares, as registered on `/metrics` (each process serves those of what it runs; a vector has a series once it has a value). ")
	b.WriteString("What to watch and the alerts on them: [operations.md](operations.md).\n\n")
	b.WriteString("| metric | type | labels | what it counts |\n|---|---|---|---|\n")
	for i, m := range all {
		if i > 0 && all[i-1].name == m.name {
			return "", fmt.Errorf("metric %s declared twice", m.name)
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.name, m.kind, strings.Join(m.labels, ", "), strings.ReplaceAll(m.help, "|", `\|`))
	}
	return b.String(), nil
}

// kindOf is the type of c's series: a vector's from its Go type, a single
// metric's from what it writes (a Gauge has a Counter's methods, a Summary
// a Histogram's), a collector of kvnet's own from its ValueType.
func kindOf(c prometheus.Collector) (string, error) {
	switch c := c.(type) {
	case *prometheus.HistogramVec:
		return "histogram", nil
	case *prometheus.SummaryVec:
		return "summary", nil
	case *prometheus.CounterVec:
		return "counter", nil
	case *prometheus.GaugeVec:
		return "gauge", nil
	case valueTyped:
		switch c.ValueType() {
		case prometheus.CounterValue:
			return "counter", nil
		case prometheus.GaugeValue:
			return "gauge", nil
		}
	case prometheus.Metric:
		var m dto.Metric
		if err := c.Write(&m); err != nil {
			return "", err
		}
		switch {
		case m.Histogram != nil:
			return "histogram", nil
		case m.Summary != nil:
			return "summary", nil
		case m.Counter != nil:
			return "counter", nil
		case m.Gauge != nil:
			return "gauge", nil
		}
	}
	return "", fmt.Errorf("a collector of type %T says not what type its series are (give it a ValueType method)", c)
}
