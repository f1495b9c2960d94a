// Package scrape reads a running shepherd's HTTP endpoints for tests and
// tools: a GET with a bound, and /metrics parsed into families whose
// series can be looked up by label.
package scrape

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Get fetches url, bounded by timeout: a hung daemon fails a test instead
// of stalling it.
func Get(url string, timeout time.Duration) (int, string, error) {
	client := http.Client{Timeout: timeout}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Metrics fetches and parses the Prometheus text exposition at url,
// returning the families and the body as served.
func Metrics(url string, timeout time.Duration) (Families, string, error) {
	code, body, err := Get(url, timeout)
	if err != nil {
		return nil, "", err
	}
	if code != http.StatusOK {
		return nil, body, fmt.Errorf("GET %s: status %d", url, code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, body, fmt.Errorf("parsing %s: %w", url, err)
	}
	return fams, body, nil
}

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Value is the value of the first series of name whose labels include
// labels (name, value pairs): a counter's or gauge's value, a histogram's
// sample count. It is -1 when there is no such series.
func (f Families) Value(name string, labels ...string) float64 {
	for _, s := range f.series(name, labels) {
		switch {
		case s.Counter != nil:
			return s.Counter.GetValue()
		case s.Gauge != nil:
			return s.Gauge.GetValue()
		case s.Histogram != nil:
			return float64(s.Histogram.GetSampleCount())
		case s.Untyped != nil:
			return s.Untyped.GetValue()
		}
	}
	return -1
}

// Sum adds up the counter and gauge series of name whose labels include
// labels (name, value pairs). It fails when the family is missing.
func (f Families) Sum(name string, labels ...string) (float64, error) {
	if f[name] == nil {
		return 0, fmt.Errorf("no metric %s", name)
	}
	sum := 0.0
	for _, s := range f.series(name, labels) {
		sum += s.GetCounter().GetValue() + s.GetGauge().GetValue()
	}
	return sum, nil
}

// series are the series of name whose labels include labels.
func (f Families) series(name string, labels []string) []*dto.Metric {
	fam := f[name]
	if fam == nil {
		return nil
	}
	var out []*dto.Metric
	for _, s := range fam.GetMetric() {
		if hasLabels(s, labels) {
			out = append(out, s)
		}
	}
	return out
}

func hasLabels(s *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range s.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
