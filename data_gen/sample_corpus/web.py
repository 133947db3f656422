"""Web scenarios: a shop search with a finger-direction swipe, and a contact form."""

from __future__ import annotations

from data_gen.sample_corpus._base import (
    PEOPLE,
    PRODUCTS,
    Ctx,
    Episode,
    at,
    step,
    terminate,
)
from data_gen.sample_corpus.screens import Box, Screen, browser


def _shop_header(scr: Screen, page: Box, query: str, focused: bool) -> None:
    u = scr.u
    scr.rect((page[0], page[1], page[2], page[1] + u(64)), "#232f3e")
    scr.text((u(24), page[1] + u(32)), "ShopLite", 22, "#ffffff")
    scr.element("ShopLite", "link", (u(16), page[1] + u(12), u(130), page[1] + u(52)))
    scr.field(
        (u(180), page[1] + u(16), page[2] - u(260), page[1] + u(48)),
        "Search products",
        query,
        focused,
    )
    scr.button(
        (page[2] - u(250), page[1] + u(16), page[2] - u(160), page[1] + u(48)), "Search", True
    )
    scr.button((page[2] - u(140), page[1] + u(16), page[2] - u(24), page[1] + u(48)), "Cart (0)")


def web_search(ctx: Ctx) -> Episode:
    """Shop: search, swipe the results (finger direction), open one, answer its price."""
    (w, h), rng = ctx.size, ctx.rng
    products = rng.sample(PRODUCTS, 10)
    missing = rng.random() < 0.25
    query = "vintage typewriter" if missing else products[rng.randint(6, 9)][0]
    url = "http://shoplite.test/"

    def frame(
        k: int,
        q: str,
        focused: bool,
        results: int | None,
        offset: int = 0,
        product: tuple[str, str] | None = None,
    ):
        scr, page = browser(
            w,
            h,
            ctx.clock(k),
            url + (f"search?q={q.replace(' ', '+')}" if results is not None else ""),
            "ShopLite",
        )
        _shop_header(scr, page, q, focused)
        body = (page[0] + scr.u(24), page[1] + scr.u(80), page[2] - scr.u(24), page[3] - scr.u(16))
        if product is not None:
            scr.text((body[0], body[1] + scr.u(30)), product[0], 22)
            scr.text((body[0], body[1] + scr.u(70)), f"Price: {product[1]}", 18, "#b12704")
            scr.button(
                (body[0], body[1] + scr.u(100), body[0] + scr.u(160), body[1] + scr.u(136)),
                "Add to cart",
                True,
            )
        elif results == 0:
            scr.text((body[0], body[1] + scr.u(30)), f'No results for "{q}".', 18)
        elif results is not None:
            scr.rows(
                body,
                [n for n, _ in products],
                offset,
                72,
                role="link",
                details=[pr for _, pr in products],
            )
        else:
            scr.text((body[0], body[1] + scr.u(30)), "Deals of the day", 20)
        return scr

    s0 = frame(0, "", False, None)
    s1 = frame(1, "", True, None)
    ep = Episode(
        "web_search",
        "web",
        "ShopLite",
        [
            f"Find the price of '{query}' on ShopLite.",
            f"Search ShopLite for {query} and tell me how much it costs.",
            f"How much is the {query} on the ShopLite store?",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The ShopLite home page has a search box at the top.",
            "Click the search box",
            at(ctx, s0, "click", "Search products"),
        ),
        step(
            s1,
            "The search box is focused.",
            f"Type {query} and press Enter to search",
            f"write(message={query!r})",
            "press(keys='enter')",
        ),
    ]
    if missing:
        ep.outcome = "failure"
        s2 = frame(2, query, False, 0)
        ep.steps.append(
            step(
                s2,
                "The store has no results for this product.",
                "Give up, the product is not sold here",
                terminate(False, rng, "no results"),
            )
        )
        return ep
    s2 = frame(2, query, False, len(products))
    visible = sum(1 for e in s2.elements if e.role == "link" and e.label != "ShopLite")
    shift = max(0, min(len(products) - visible, products.index((query, dict(products)[query])) - 1))
    s3 = frame(3, query, False, len(products), shift)
    price = dict(products)[query]
    s4 = frame(4, query, False, None, product=(query, price))
    s5 = frame(5, query, False, None, product=(query, price))
    ep.steps += [
        step(
            s2,
            "The results list is longer than the page; the product is further down.",
            "Scroll down the results page",
            "swipe(direction='up', amount=0.5)",
        ),
        step(
            s3,
            f"{query} is now visible in the results.",
            f"Open the result {query}",
            at(ctx, s3, "click", query),
        ),
        step(
            s4,
            f"The product page shows the price {price}.",
            f"Answer that it costs {price}",
            f"response(answer={price!r})",
        ),
        step(s5, "The price has been reported.", "The task is complete", terminate(True, rng)),
    ]
    return ep


def web_form(ctx: Ctx) -> Episode:
    """Contact form: click + type into two fields (multi-call steps), tick a box, submit."""
    (w, h), rng = ctx.size, ctx.rng
    name = rng.choice(PEOPLE)
    email = name.split()[0].lower() + "@example.org"

    def frame(k: int, n: str, e: str, agreed: bool, sent: bool = False):
        scr, page = browser(w, h, ctx.clock(k), "http://helpdesk.test/contact", "Contact us")
        u = scr.u
        x0, y = page[0] + u(80), page[1] + u(40)
        if sent:
            scr.text((x0, y), f"Thanks, {n}! Your message was sent.", 22)
            scr.button((x0, y + u(40), x0 + u(180), y + u(76)), "Back to home")
            return scr
        scr.text((x0, y), "Contact us", 24)
        for i, (label, value) in enumerate((("Full name", n), ("Email address", e))):
            top = y + u(50) + i * u(70)
            scr.text((x0, top), label, 13)
            scr.field((x0, top + u(14), x0 + u(420), top + u(46)), label, value)
        scr.checkbox(x0, y + u(200), "I agree to the privacy policy", agreed)
        scr.button((x0, y + u(240), x0 + u(120), y + u(276)), "Submit", True)
        return scr

    s0 = frame(0, "", "", False)
    s1 = frame(1, name, "", False)
    s2 = frame(2, name, email, False)
    s3 = frame(3, name, email, True)
    s4 = frame(4, name, email, True, sent=True)
    ep = Episode(
        "web_form",
        "web",
        "Helpdesk",
        [
            f"Submit the contact form as {name} with email {email}.",
            f"Fill in the helpdesk contact form for {name} ({email}) and send it.",
        ],
    )
    ep.steps = [
        step(
            s0,
            "The contact form is empty.",
            f"Enter {name} in the Full name field",
            at(ctx, s0, "click", "Full name"),
            f"write(message={name!r})",
        ),
        step(
            s1,
            "The name is filled in; the email field is next.",
            f"Enter {email} in the Email address field",
            at(ctx, s1, "click", "Email address"),
            f"write(message={email!r})",
        ),
        step(
            s2,
            "Both fields are filled; the privacy checkbox must be ticked before submitting.",
            "Tick the privacy policy checkbox",
            at(ctx, s2, "click", "I agree to the privacy policy"),
        ),
        step(s3, "The checkbox is ticked.", "Click Submit", at(ctx, s3, "click", "Submit")),
        step(
            s4,
            "The confirmation message is shown.",
            "The form was sent, the task is complete",
            terminate(True, rng),
        ),
    ]
    return ep
