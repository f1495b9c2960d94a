// Package benchplot draws the line charts of shepherd-bench as PNG images
// with gonum.org/v1/plot, a maintained plotting library: lines through
// points, horizontal reference lines (a ceiling or a target measured in the
// same run), axes with ticks and units, and a legend beside the plot so
// that it hides no data. The package only maps the benchmark's few chart
// elements onto the library; drawing, text and fonts are the library's.
package benchplot

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is a line through points, drawn with a marker at each.
type Series struct {
	Name  string
	X, Y  []float64
	Color color.RGBA
}

// HLine is a horizontal reference line across the plot.
type HLine struct {
	Name   string
	Y      float64
	Color  color.RGBA
	Dashed bool
}

// Chart is a line chart. Its x axis is logarithmic when XLog2 is set, with
// ticks at the x values (powers of two suit worker counts 1, 4, 16, 64).
// The y axis starts at zero.
type Chart struct {
	Title string
	// XLabel and YLabel name the axes with their units.
	XLabel string
	YLabel string
	XLog2  bool
	// XTicks are the x values labelled on the axis (default: the x values
	// of the series).
	XTicks []float64
	Series []Series
	HLines []HLine
	// Width and Height in pixels (default 1280 x 600).
	Width, Height int
}

// Palette is a set of distinguishable colours for series and lines.
var Palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, // blue
	{0xd6, 0x27, 0x28, 0xff}, // red
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0xff, 0x7f, 0x0e, 0xff}, // orange
	{0x94, 0x67, 0xbd, 0xff}, // purple
	{0x7f, 0x7f, 0x7f, 0xff}, // grey
	{0x8c, 0x56, 0x4b, 0xff}, // brown
	{0xe3, 0x77, 0xc2, 0xff}, // pink
}

// dpi is the resolution of the PNG: lengths and font sizes are in points,
// the image in pixels.
const dpi = 96

// WriteFile renders the chart into a PNG file, creating its directory.
func (c Chart) WriteFile(path string) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("benchplot: %w", err)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("benchplot: %w", err)
	}
	if err := c.WritePNG(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("benchplot: %w", err)
	}
	return nil
}

// WritePNG renders the chart as PNG to w.
func (c Chart) WritePNG(w io.Writer) error {
	img, err := c.Render()
	if err != nil {
		return err
	}
	if err := png.Encode(w, img); err != nil {
		return fmt.Errorf("benchplot: encoding the PNG: %w", err)
	}
	return nil
}

// Render draws the chart: the plot on the left, its legend on the right,
// level with the top of the data area.
func (c Chart) Render() (image.Image, error) {
	if c.Width == 0 {
		c.Width = 1280
	}
	if c.Height == 0 {
		c.Height = 600
	}
	if c.Width <= 0 || c.Height <= 0 {
		return nil, fmt.Errorf("benchplot: size %dx%d", c.Width, c.Height)
	}
	p, legend, err := c.plot()
	if err != nil {
		return nil, err
	}
	px := func(n int) vg.Length { return vg.Length(n) * vg.Inch / dpi }
	canvas := vgimg.NewWith(vgimg.UseWH(px(c.Width), px(c.Height)), vgimg.UseDPI(dpi))
	dc := draw.New(canvas)
	margin := vg.Points(12)
	dc = draw.Crop(dc, margin, -margin, margin, -margin)

	legendW := vg.Length(0)
	if len(c.Series)+len(c.HLines) > 0 {
		legendW = legend.Rectangle(dc).Size().X + margin
	}
	p.Draw(draw.Crop(dc, 0, -legendW, 0, 0))
	if legendW > 0 {
		titleH := p.Title.TextStyle.Rectangle(p.Title.Text).Size().Y + p.Title.Padding
		legend.Draw(draw.Crop(dc, dc.Size().X-legendW+margin, 0, 0, -titleH))
	}
	return canvas.Image(), nil
}

// plot builds the gonum plot of the chart and its legend, which is drawn
// apart (a plot's own legend is drawn over its data).
func (c Chart) plot() (*plot.Plot, *plot.Legend, error) {
	xs := slices.Clone(c.XTicks)
	ymax := 0.0
	for _, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return nil, nil, fmt.Errorf("benchplot: series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		if c.XTicks == nil {
			xs = append(xs, s.X...)
		}
		for _, y := range s.Y {
			ymax = math.Max(ymax, y)
		}
	}
	for _, h := range c.HLines {
		ymax = math.Max(ymax, h.Y)
	}
	if len(xs) == 0 {
		return nil, nil, errors.New("benchplot: nothing to plot")
	}
	slices.Sort(xs)
	xs = slices.Compact(xs)
	xmin, xmax := xs[0], xs[len(xs)-1]
	if c.XLog2 && xmin <= 0 {
		return nil, nil, errors.New("benchplot: log x axis needs positive x values")
	}

	p := plot.New()
	p.Title.Text = c.Title
	p.Title.TextStyle.Font.Size = vg.Points(15)
	p.Title.Padding = vg.Points(10)
	p.X.Label.Text, p.Y.Label.Text = c.XLabel, c.YLabel
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font.Size = vg.Points(12)
		a.Tick.Label.Font.Size = vg.Points(11)
	}
	legend := plot.NewLegend()
	legend.TextStyle.Font.Size = vg.Points(11)
	legend.Top, legend.Left = true, true
	legend.ThumbnailWidth = vg.Points(36)
	legend.Padding = vg.Points(4)

	// The x axis leaves a margin around the outer points so that markers
	// sit inside the plot; reference lines run across all of it.
	ticks := make([]plot.Tick, len(xs))
	for i, x := range xs {
		ticks[i] = plot.Tick{Value: x, Label: strconv.FormatFloat(x, 'g', -1, 64)}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	if c.XLog2 {
		p.X.Scale = plot.LogScale{}
		f := math.Pow(xmax/xmin, 0.05)
		if f == 1 {
			f = 2
		}
		p.X.Min, p.X.Max = xmin/f, xmax*f
	} else {
		d := (xmax - xmin) * 0.05
		if d == 0 {
			d = 1
		}
		p.X.Min, p.X.Max = xmin-d, xmax+d
	}
	p.Y.Min = 0
	p.Y.Max = ymax * 1.08
	if p.Y.Max <= 0 {
		p.Y.Max = 1
	}
	p.Y.Tick.Marker = yTicks{}
	p.Add(plotter.NewGrid())

	// Reference lines are drawn first, under the series; the legend lists
	// the series first.
	var refs []*plotter.Line
	for _, h := range c.HLines {
		l, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: h.Y}, {X: p.X.Max, Y: h.Y}})
		if err != nil {
			return nil, nil, fmt.Errorf("benchplot: line %q: %w", h.Name, err)
		}
		l.Color = h.Color
		l.Width = vg.Points(1.5)
		if h.Dashed {
			l.Dashes = []vg.Length{vg.Points(8), vg.Points(5)}
		}
		p.Add(l)
		refs = append(refs, l)
	}
	for _, s := range c.Series {
		xys := make(plotter.XYs, len(s.X))
		for i := range s.X {
			xys[i] = plotter.XY{X: s.X[i], Y: s.Y[i]}
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, nil, fmt.Errorf("benchplot: series %q: %w", s.Name, err)
		}
		l.Color, l.Width = s.Color, vg.Points(2.5)
		pts.Color, pts.Shape, pts.Radius = s.Color, draw.CircleGlyph{}, vg.Points(4)
		p.Add(l, pts)
		legend.Add(s.Name, l, pts)
	}
	for i, h := range c.HLines {
		legend.Add(h.Name, refs[i])
	}
	return p, &legend, nil
}

// yTicks labels the y axis every 1, 2 or 5 times a power of ten, at 5 to
// 10 ticks, where the library's default puts about three, too few to read
// a rate off the plot.
type yTicks struct{}

// Ticks returns the ticks between min and max.
func (yTicks) Ticks(min, max float64) []plot.Tick {
	if !(max > min) {
		return plot.DefaultTicks{}.Ticks(min, max)
	}
	raw := (max - min) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if raw <= m*mag {
			step = m * mag
			break
		}
	}
	var ticks []plot.Tick
	for i := math.Ceil(min / step); i*step <= max; i++ {
		v := i * step
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ticks
}
