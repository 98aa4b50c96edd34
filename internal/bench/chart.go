package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// The charts are drawn with image/png and x/image's fixed 7x13 font rather
// than a plotting library: two line charts do not justify adding a plotting
// library's dependency tree to the plugin's go.mod.

// Series is one line of a chart.
type Series struct {
	Name  string
	X, Y  []float64
	Color color.RGBA
	// Dashed draws the line in 6-pixel dashes.
	Dashed bool
}

// HLine is a labelled horizontal reference line.
type HLine struct {
	Y     float64
	Label string
}

// Chart is a line chart with a legend.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	HLines                []HLine
	// LogX uses a base-10 logarithmic x axis (all X must be > 0).
	LogX bool
	// XFormat formats tick labels on the x axis (default %g).
	XFormat func(float64) string
	// LegendBottom puts the legend in the bottom right corner instead of
	// the top right.
	LegendBottom bool
	// Fixed ranges; zero values mean "fit the data" (Y starts at 0).
	XMin, XMax, YMax float64
}

// Palette used by the driver: distinct and readable on white.
var (
	Blue   = color.RGBA{31, 119, 180, 255}
	Orange = color.RGBA{255, 127, 14, 255}
	Green  = color.RGBA{44, 160, 44, 255}
	Red    = color.RGBA{214, 39, 40, 255}
	Purple = color.RGBA{148, 103, 189, 255}
	Grey   = color.RGBA{127, 127, 127, 255}
	Brown  = color.RGBA{140, 86, 75, 255}
)

var (
	white     = color.RGBA{255, 255, 255, 255}
	black     = color.RGBA{0, 0, 0, 255}
	gridColor = color.RGBA{225, 225, 225, 255}
)

// WritePNG draws the chart at w x h pixels into path.
func (c Chart) WritePNG(path string, w, h int) error {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), &image.Uniform{white}, image.Point{}, draw.Src)

	const left, right, top, bottom = 70, 20, 48, 50
	pw, ph := w-left-right, h-top-bottom

	xmin, xmax, ymax := c.XMin, c.XMax, c.YMax
	if xmin == 0 && xmax == 0 {
		xmin, xmax = math.Inf(1), math.Inf(-1)
		for _, s := range c.Series {
			for _, x := range s.X {
				xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			}
		}
	}
	if ymax == 0 {
		for _, s := range c.Series {
			for _, y := range s.Y {
				ymax = math.Max(ymax, y)
			}
		}
		for _, l := range c.HLines {
			ymax = math.Max(ymax, l.Y)
		}
		ymax *= 1.08
	}
	if math.IsInf(xmin, 0) || xmax <= xmin {
		xmin, xmax = 0, 1
	}
	if ymax <= 0 {
		ymax = 1
	}
	tx := func(x float64) float64 { return x }
	if c.LogX {
		tx = math.Log10
	}
	px := func(x float64) int {
		return left + int(math.Round((tx(x)-tx(xmin))/(tx(xmax)-tx(xmin))*float64(pw)))
	}
	// Values above ymax are drawn at the top edge (the axis is cut there).
	py := func(y float64) int { return top + ph - int(math.Round(min(y, ymax)/ymax*float64(ph))) }

	xf := c.XFormat
	if xf == nil {
		xf = func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
	}
	// Grid and ticks.
	var xticks []float64
	if c.LogX {
		for e := math.Floor(math.Log10(xmin)); e <= math.Ceil(math.Log10(xmax)); e++ {
			for _, m := range []float64{1, 2, 5} {
				v := m * math.Pow(10, e)
				if v >= xmin && v <= xmax {
					xticks = append(xticks, v)
				}
			}
		}
	} else {
		xticks = niceTicks(xmin, xmax, 8)
	}
	for _, v := range xticks {
		x := px(v)
		vline(img, x, top, top+ph, gridColor)
		label := xf(v)
		text(img, x-len(label)*7/2, top+ph+16, label, black)
	}
	for _, v := range niceTicks(0, ymax, 6) {
		y := py(v)
		if y < top {
			continue
		}
		hline(img, left, left+pw, y, gridColor)
		label := strconv.FormatFloat(v, 'g', 4, 64)
		text(img, left-6-len(label)*7, y+4, label, black)
	}
	// Axes.
	vline(img, left, top, top+ph, black)
	hline(img, left, left+pw, top+ph, black)

	for _, l := range c.HLines {
		y := py(l.Y)
		for x := left; x < left+pw; x += 8 {
			hline(img, x, min(x+4, left+pw), y, Grey)
		}
		text(img, left+pw-len(l.Label)*7-4, y-4, l.Label, Grey)
	}
	for _, s := range c.Series {
		phase := 0 // dashes continue across the short segments of a curve
		for i := 1; i < len(s.X); i++ {
			if c.LogX && (s.X[i-1] <= 0 || s.X[i] <= 0) {
				continue
			}
			phase = line(img, px(s.X[i-1]), py(s.Y[i-1]), px(s.X[i]), py(s.Y[i]), s.Color, s.Dashed, phase)
		}
	}

	// Title, axis labels, legend.
	text(img, w/2-len(c.Title)*7/2, 16, c.Title, black)
	text(img, left+pw/2-len(c.XLabel)*7/2, h-12, c.XLabel, black)
	text(img, 6, top-10, c.YLabel, black)
	lw := 0
	for _, s := range c.Series {
		lw = max(lw, len(s.Name)*7)
	}
	lx, ly := left+pw-lw-40, top+8
	if c.LegendBottom {
		ly = top + ph - len(c.Series)*16 - 8
	}
	fill(img, image.Rect(lx-6, ly-4, left+pw-4, ly+len(c.Series)*16+2), white)
	for i, s := range c.Series {
		y := ly + i*16 + 6
		for t := -1; t <= 1; t++ {
			line(img, lx, y+t, lx+24, y+t, s.Color, s.Dashed, 0)
		}
		text(img, lx+30, y+4, s.Name, black)
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// niceTicks returns about n round tick values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	span := hi - lo
	if span <= 0 {
		return []float64{lo}
	}
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		out = append(out, math.Round(v/step)*step)
	}
	return out
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: &image.Uniform{c}, Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, &image.Uniform{c}, image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) {
	for x := x0; x <= x1; x++ {
		img.SetRGBA(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, c)
	}
}

// line draws a 2-pixel-wide line (Bresenham, doubled vertically) and
// returns the dash phase to continue with on the next segment.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, dashed bool, phase int) int {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	err := dx + dy
	for n := phase; ; n++ {
		if !dashed || (n/6)%2 == 0 {
			img.SetRGBA(x0, y0, c)
			img.SetRGBA(x0, y0+1, c)
		}
		if x0 == x1 && y0 == y1 {
			return n
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// FormatMillis formats a value in milliseconds for a latency axis.
func FormatMillis(v float64) string {
	if v < 1 {
		return fmt.Sprintf("%gms", v)
	}
	return strconv.FormatFloat(v, 'f', -1, 64) + "ms"
}
