// Typesets the \( \) and \[ \] spans pymdownx.arithmatex (generic mode) writes, with the KaTeX
// copy under assets/katex/ (no CDN). document$ re-runs it after Material's instant navigation.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
    throwOnError: false,
  });
});
