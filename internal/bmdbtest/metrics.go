package bmdbtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/scrape"
)

// Metric sums the counter and gauge series of the family name in g (a
// test's registry) whose labels include labels (name, value pairs), as
// scrape.Families.Sum does for a daemon's /metrics. It fails t when g has
// no such family: a misspelt name must not read as zero.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	sum, err := gather(t, g).Sum(name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// MetricOrZero is Metric for a vector that may have no series yet: such a
// family is not gathered at all, and reads as zero here.
func MetricOrZero(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	fams := gather(t, g)
	if fams[name] == nil {
		return 0
	}
	sum, err := fams.Sum(name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func gather(t testing.TB, g prometheus.Gatherer) scrape.Families {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	fams := make(scrape.Families, len(mfs))
	for _, mf := range mfs {
		fams[mf.GetName()] = mf
	}
	return fams
}
