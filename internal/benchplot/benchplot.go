// Package benchplot draws the line charts of shepherd-bench as PNG images
// with the standard library only: a benchmark's picture should not need a
// plotting stack in go.mod. It knows exactly what the benchmark needs: lines
// through points, horizontal reference lines, axes with ticks, a legend and
// a title, in a built-in bitmap font.
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
	"strconv"
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

// Chart is a line chart. Its x axis is logarithmic (base 2) when XLog2 is
// set, which suits worker counts 1, 4, 16, 64. The y axis starts at zero.
type Chart struct {
	Title  string
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
}

var (
	white = color.RGBA{0xff, 0xff, 0xff, 0xff}
	black = color.RGBA{0x20, 0x20, 0x20, 0xff}
	grid  = color.RGBA{0xe4, 0xe4, 0xe4, 0xff}
)

const textScale = 2 // bitmap font cells are drawn as 2x2 pixels

// WriteFile renders the chart into a PNG file, creating its directory.
func (c Chart) WriteFile(path string) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.WritePNG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WritePNG renders the chart as PNG to w.
func (c Chart) WritePNG(w io.Writer) error {
	img, err := c.Render()
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// Render draws the chart.
func (c Chart) Render() (*image.RGBA, error) {
	if c.Width == 0 {
		c.Width = 1280
	}
	if c.Height == 0 {
		c.Height = 600
	}
	xs := c.XTicks
	ymax := 0.0
	for _, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return nil, fmt.Errorf("benchplot: series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
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
		return nil, errors.New("benchplot: nothing to plot")
	}
	xmin, xmax := xs[0], xs[0]
	for _, x := range xs {
		xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
	}
	tx := func(x float64) float64 { return x }
	if c.XLog2 {
		if xmin <= 0 {
			return nil, errors.New("benchplot: log x axis needs positive x values")
		}
		tx = math.Log2
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	step, top := niceScale(ymax)

	img := image.NewRGBA(image.Rect(0, 0, c.Width, c.Height))
	fill(img, img.Bounds(), white)

	// Legend entries, drawn right of the plot so that they hide no data.
	type entry struct {
		name   string
		col    color.RGBA
		dashed bool
		marker bool
	}
	var entries []entry
	for _, s := range c.Series {
		entries = append(entries, entry{s.Name, s.Color, false, true})
	}
	for _, h := range c.HLines {
		entries = append(entries, entry{h.Name, h.Color, h.Dashed, false})
	}
	legendW := 0
	for _, e := range entries {
		legendW = max(legendW, textWidth(e.name)+80)
	}

	// Plot area.
	left, right := 120, c.Width-40-legendW
	topPx, bottom := 70, c.Height-80
	px := func(x float64) int {
		f := (tx(x) - tx(xmin)) / (tx(xmax) - tx(xmin))
		margin := 0.05
		return left + int(math.Round((margin+f*(1-2*margin))*float64(right-left)))
	}
	py := func(y float64) int {
		return bottom - int(math.Round(y/top*float64(bottom-topPx)))
	}

	// Grid and y ticks.
	for y := 0.0; y <= top+step/2; y += step {
		yy := py(y)
		line(img, left, yy, right, yy, grid, 1, false)
		label := formatTick(y)
		drawText(img, left-10-textWidth(label), yy-glyphH*textScale/2, label, black)
	}
	// x ticks.
	seen := map[float64]bool{}
	for _, x := range xs {
		if seen[x] {
			continue
		}
		seen[x] = true
		xx := px(x)
		line(img, xx, topPx, xx, bottom, grid, 1, false)
		line(img, xx, bottom, xx, bottom+6, black, 1, false)
		label := formatTick(x)
		drawText(img, xx-textWidth(label)/2, bottom+12, label, black)
	}
	// Axes.
	line(img, left, bottom, right, bottom, black, 2, false)
	line(img, left, topPx, left, bottom, black, 2, false)

	// Reference lines, then series on top.
	for _, h := range c.HLines {
		line(img, left, py(h.Y), right, py(h.Y), h.Color, 2, h.Dashed)
	}
	for _, s := range c.Series {
		for i := range s.X {
			x, y := px(s.X[i]), py(s.Y[i])
			if i > 0 {
				line(img, px(s.X[i-1]), py(s.Y[i-1]), x, y, s.Color, 3, false)
			}
			fill(img, image.Rect(x-5, y-5, x+6, y+6), s.Color)
		}
	}

	// Title, axis labels.
	drawText(img, (left+right-textWidth(c.Title))/2, 20, c.Title, black)
	drawText(img, (left+right-textWidth(c.XLabel))/2, bottom+45, c.XLabel, black)
	drawTextUp(img, 20, (topPx+bottom+textWidth(c.YLabel))/2, c.YLabel, black)

	// Legend, right of the plot, level with its top.
	if len(entries) > 0 {
		lineH := glyphH*textScale + 10
		box := image.Rect(right+20, topPx, right+20+legendW, topPx+len(entries)*lineH+10)
		rectangle(img, box, grid)
		for i, e := range entries {
			y := box.Min.Y + 10 + i*lineH + glyphH*textScale/2
			line(img, box.Min.X+10, y, box.Min.X+50, y, e.col, 3, e.dashed)
			if e.marker {
				fill(img, image.Rect(box.Min.X+25, y-5, box.Min.X+36, y+6), e.col)
			}
			drawText(img, box.Min.X+60, y-glyphH*textScale/2, e.name, black)
		}
	}
	return img, nil
}

// niceScale picks a tick step of 1, 2 or 5 times a power of ten giving 4 to
// 10 ticks, and the top of the axis (a multiple of the step above ymax).
func niceScale(ymax float64) (step, top float64) {
	if ymax <= 0 {
		return 1, 1
	}
	raw := ymax / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	switch r := raw / mag; {
	case r <= 1:
		step = mag
	case r <= 2:
		step = 2 * mag
	case r <= 5:
		step = 5 * mag
	default:
		step = 10 * mag
	}
	top = math.Ceil(ymax*1.05/step) * step
	return step, top
}

func formatTick(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func rectangle(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	line(img, r.Min.X, r.Min.Y, r.Max.X, r.Min.Y, c, 1, false)
	line(img, r.Min.X, r.Max.Y, r.Max.X, r.Max.Y, c, 1, false)
	line(img, r.Min.X, r.Min.Y, r.Min.X, r.Max.Y, c, 1, false)
	line(img, r.Max.X, r.Min.Y, r.Max.X, r.Max.Y, c, 1, false)
}

// line draws a line of the given thickness; dashed lines alternate 12
// pixels on and 8 off along the line.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, width int, dashed bool) {
	dx, dy := x1-x0, y1-y0
	n := max(abs(dx), abs(dy))
	for i := 0; i <= n; i++ {
		if dashed && i%20 >= 12 {
			continue
		}
		x, y := x0, y0
		if n > 0 {
			x = x0 + int(math.Round(float64(dx*i)/float64(n)))
			y = y0 + int(math.Round(float64(dy*i)/float64(n)))
		}
		off := (width - 1) / 2
		fill(img, image.Rect(x-off, y-off, x-off+width, y-off+width), c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// textWidth is the width in pixels of s in the bitmap font.
func textWidth(s string) int {
	n := len([]rune(s))
	if n == 0 {
		return 0
	}
	return (n*(glyphW+1) - 1) * textScale
}

// drawText draws s with its top-left corner at (x, y).
func drawText(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range s {
		g := glyph(r)
		for row := 0; row < glyphH; row++ {
			for col := 0; col < glyphW; col++ {
				if g[row][col] == '#' {
					fill(img, image.Rect(x+col*textScale, y+row*textScale, x+(col+1)*textScale, y+(row+1)*textScale), c)
				}
			}
		}
		x += (glyphW + 1) * textScale
	}
}

// drawTextUp draws s rotated a quarter turn anticlockwise, reading upwards,
// starting at (x, y), its bottom-left corner.
func drawTextUp(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range s {
		g := glyph(r)
		for row := 0; row < glyphH; row++ {
			for col := 0; col < glyphW; col++ {
				if g[row][col] == '#' {
					px, py := x+row*textScale, y-(col+1)*textScale
					fill(img, image.Rect(px, py, px+textScale, py+textScale), c)
				}
			}
		}
		y -= (glyphW + 1) * textScale
	}
}
