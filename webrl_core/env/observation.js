// One in-page pass that labels interactive elements and serialises the visible page as WebRL's
// simplified HTML. Called as page.evaluate(SCRIPT, opts) with
//   opts = {keepBbox, maxText, viewportOnly, quietMs, settleMs}
// and returns {html, nLabels, url, title, scrollY, scrollHeight}.
// Written for webrl (see observation.py for the output contract).
async (opts) => {
  // 1. settle: resolve once the DOM has been quiet for quietMs (bounded by settleMs)
  if (opts.settleMs > 0) {
    await new Promise((resolve) => {
      let timer = null;
      const done = () => { obs.disconnect(); clearTimeout(cap); resolve(); };
      const obs = new MutationObserver(() => { clearTimeout(timer); timer = setTimeout(done, opts.quietMs); });
      obs.observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
      timer = setTimeout(done, opts.quietMs);
      const cap = setTimeout(done, opts.settleMs);
    });
  }

  const SKIP = new Set(["script", "style", "noscript", "template", "head", "meta", "link", "title", "base", "br", "wbr"]);
  const VOID = new Set(["input", "img", "hr", "area"]);
  const NATIVE = new Set(["a", "button", "input", "select", "textarea", "summary"]);
  const ROLES = new Set(["button", "link", "checkbox", "radio", "tab", "menuitem", "menuitemcheckbox", "menuitemradio",
    "option", "switch", "combobox", "textbox", "searchbox", "treeitem", "slider", "spinbutton", "gridcell"]);
  const KEEP = ["title", "value", "type", "placeholder", "selected", "data-value", "data-text", "data-testid",
    "data-label", "data-status"];
  const W = window.innerWidth, H = window.innerHeight;

  for (const el of document.querySelectorAll("[data-label-id]")) el.removeAttribute("data-label-id");

  const escText = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const escAttr = (s) => s.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;");
  const clean = (s) => s.replace(/\s+/g, " ").trim();
  const cut = (s) => (s.length > opts.maxText ? s.slice(0, opts.maxText) : s);

  const inView = (r) => r.width > 0 && r.height > 0 && r.bottom > 0 && r.right > 0 && r.top < H && r.left < W;
  const shown = (r) => (opts.viewportOnly ? inView(r) : r.width > 0 && r.height > 0);

  function textVisible(node) {
    if (!opts.viewportOnly) return true;
    const range = document.createRange();
    range.selectNodeContents(node);
    const rects = range.getClientRects();
    for (const r of rects) if (inView(r)) return true;
    return false;
  }

  function interactive(el, tag, style, parentPointer) {
    if (NATIVE.has(tag)) {
      if (tag === "a") return el.hasAttribute("href") || style.cursor === "pointer" || el.hasAttribute("onclick");
      if (tag === "input" && (el.type || "").toLowerCase() === "hidden") return false;
      return true;
    }
    if (el.hasAttribute("onclick") || typeof el.onclick === "function") return true;
    const role = (el.getAttribute("role") || "").toLowerCase();
    if (ROLES.has(role)) return true;
    if (el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable)) return true;
    if (el.hasAttribute("jsaction") && /click/.test(el.getAttribute("jsaction"))) return true;
    // cursor:pointer is inherited: only the top of a pointer region counts
    if (style.cursor === "pointer" && !parentPointer) return true;
    return false;
  }

  let next = 0;

  // returns a list of output pieces for el, or null when nothing of it is kept
  function walk(el, insideLabel, parentPointer) {
    const tag = el.tagName.toLowerCase();
    if (SKIP.has(tag)) return null;
    const style = getComputedStyle(el);
    if (style.display === "none") return null;
    const hidden = style.visibility === "hidden" || style.visibility === "collapse" || style.opacity === "0";
    const rect = el.getBoundingClientRect();
    const visible = !hidden && shown(rect);
    const pointer = style.cursor === "pointer";

    let label = null;
    if (visible && interactive(el, tag, style, parentPointer) && !el.closest("[aria-hidden=true]")) {
      // keep the outermost clickable, except that real form controls always get their own id
      if (!insideLabel || NATIVE.has(tag)) {
        label = String(next++);
        el.setAttribute("data-label-id", label);
      }
    }

    // attributes
    const attrs = [];
    if (label !== null) attrs.push(["id", label]);
    for (const k of KEEP) {
      if (k === "value" || k === "data-value" || k === "data-status") continue;  // live state below
      const v = el.getAttribute(k);
      if (v !== null && v !== "" && !(k === "type" && tag !== "input" && tag !== "button")) attrs.push([k, clean(v)]);
    }
    if (tag === "input" || tag === "textarea") {
      const type = (el.type || "").toLowerCase();
      if (type === "checkbox" || type === "radio") attrs.push(["data-status", el.checked ? "checked" : "not-checked"]);
      else if (el.value) attrs.push(["value", cut(clean(el.value))]);
    } else if (el.hasAttribute("data-value")) {
      attrs.push(["data-value", clean(el.getAttribute("data-value"))]);
    }
    if (el.hasAttribute("data-status") && tag !== "input") attrs.push(["data-status", clean(el.getAttribute("data-status"))]);
    if (el.hasAttribute("aria-checked") && label !== null && !attrs.some((a) => a[0] === "data-status"))
      attrs.push(["data-status", el.getAttribute("aria-checked") === "true" ? "checked" : "not-checked"]);
    if (opts.keepBbox && visible)
      attrs.push(["data-bbox", [rect.left, rect.top, rect.width, rect.height].map((x) => Math.round(x)).join(",")]);

    const pieces = [];
    if (tag === "select") {
      const sel = el.selectedIndex >= 0 ? el.options[el.selectedIndex] : null;
      if (sel) attrs.push(["data-value", clean(sel.textContent)]);
      if (visible) {
        for (const o of el.options) {
          const t = cut(clean(o.textContent));
          pieces.push(o.selected ? `<option data-status="selected"> ${escText(t)} </option>` : `<option> ${escText(t)} </option>`);
        }
      }
    } else if (tag === "img" || tag === "svg" || tag === "canvas" || tag === "iframe") {
      // no children worth showing; an image's alt names it
      const alt = el.getAttribute("alt") || el.getAttribute("aria-label");
      if (alt && !attrs.some((a) => a[0] === "title")) attrs.push(["title", cut(clean(alt))]);
    } else {
      for (const child of el.childNodes) {
        if (child.nodeType === Node.TEXT_NODE) {
          const t = clean(child.textContent);
          if (t && !hidden && textVisible(child)) pieces.push(escText(cut(t)));
        } else if (child.nodeType === Node.ELEMENT_NODE) {
          const sub = walk(child, insideLabel || label !== null, pointer);
          if (sub !== null) pieces.push(sub);
        }
      }
      if (child_shadow(el)) {
        const sub = walkChildren(el.shadowRoot, insideLabel || label !== null, pointer);
        if (sub) pieces.push(sub);
      }
    }
    // an interactive element with no text is named by its aria-label
    if (label !== null && pieces.length === 0 && !attrs.some((a) => a[0] === "title")) {
      const al = el.getAttribute("aria-label");
      if (al) attrs.push(["title", cut(clean(al))]);
    }

    const keptAttrs = attrs.filter((a) => a[0] !== "data-bbox");
    if (label === null && keptAttrs.length === 0) {
      if (pieces.length === 0) return null;
      // plain wrapper: show its children only (keeps observations short)
      const hasText = Array.from(el.childNodes).some((c) => c.nodeType === Node.TEXT_NODE && clean(c.textContent));
      if (!hasText && pieces.length === 1 && !opts.keepBbox) return pieces[0];
    }
    if (label === null && !visible && pieces.length === 0) return null;
    const head = "<" + tag + attrs.map(([k, v]) => ` ${k}="${escAttr(v)}"`).join("");
    if (VOID.has(tag) || tag === "svg" || tag === "canvas" || tag === "iframe") return head + "/>";
    return head + ">" + (pieces.length ? " " + pieces.join(" ") + " " : " ") + "</" + tag + ">";
  }

  function child_shadow(el) { return el.shadowRoot && el.shadowRoot.mode === "open"; }
  function walkChildren(root, insideLabel, pointer) {
    const out = [];
    for (const c of root.children) { const s = walk(c, insideLabel, pointer); if (s !== null) out.push(s); }
    return out.join(" ");
  }

  const body = document.body ? walk(document.body, false, false) : null;
  return {
    html: body || "",
    nLabels: next,
    url: location.href,
    title: document.title,
    scrollY: window.scrollY,
    scrollHeight: document.documentElement ? document.documentElement.scrollHeight : 0,
  };
}
