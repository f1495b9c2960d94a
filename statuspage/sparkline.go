package statuspage

import (
	"fmt"
	"html/template"
	"strings"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"
)

// Sparkline geometry, in SVG user units.
const (
	sparkWidth  = 120
	sparkHeight = 28
	sparkPad    = 2
)

// sparkline draws the last hour's starts (line) and failures (red line)
// of a process as an inline SVG, server-side: no script or asset needed
// to read it. Only numbers go into the markup.
func sparkline(buckets []operator.ActivityBucket) template.HTML {
	if len(buckets) == 0 {
		return ""
	}
	var top, started, failed int64
	for _, b := range buckets {
		top = max(top, b.Started, b.Failed)
		started += b.Started
		failed += b.Failed
	}
	points := func(value func(operator.ActivityBucket) int64) string {
		var sb strings.Builder
		step := float64(sparkWidth-2*sparkPad) / float64(max(len(buckets)-1, 1))
		for i, b := range buckets {
			y := float64(sparkHeight - sparkPad)
			if top > 0 {
				y -= float64(value(b)) / float64(top) * float64(sparkHeight-2*sparkPad)
			}
			fmt.Fprintf(&sb, "%.1f,%.1f ", float64(sparkPad)+float64(i)*step, y)
		}
		return strings.TrimSpace(sb.String())
	}
	minutes := int(activityWidth.Minutes()) * len(buckets)
	return template.HTML(fmt.Sprintf(
		`<svg class="spark" viewBox="0 0 %d %d" width="%d" height="%d" role="img" data-points="%d" aria-label="last %d minutes: %d started, %d failed">`+
			`<title>last %d minutes, per %d minutes: %d started, %d failed</title>`+
			`<polyline class="started" fill="none" stroke="var(--link)" stroke-width="1.5" points="%s"/>`+
			`<polyline class="failed" fill="none" stroke="var(--bad)" stroke-width="1.5" points="%s"/></svg>`,
		sparkWidth, sparkHeight, sparkWidth, sparkHeight, len(buckets), minutes, started, failed,
		minutes, int(activityWidth.Minutes()), started, failed,
		points(func(b operator.ActivityBucket) int64 { return b.Started }),
		points(func(b operator.ActivityBucket) int64 { return b.Failed })))
}
